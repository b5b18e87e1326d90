package io.ksp.driver;

import java.util.LinkedHashMap;
import java.util.Map;

/**
 * Entry point of the integration drivers: {@code Main <subcommand> --flag value ...}.
 *
 * <p>Every subcommand prints exactly one JSON object on stdout (its summary) and exits 0 when
 * it ran to the end, 2 on bad arguments, 1 on a failure. Add a subcommand (e.g. a
 * KafkaShareConsumer driver) by writing a class with a {@code run(Args)} method and one line
 * in {@link #SUBCOMMANDS}.
 */
public final class Main {
    interface Subcommand {
        Json run(Args args) throws Exception;
    }

    private static final Map<String, Subcommand> SUBCOMMANDS = new LinkedHashMap<>();

    static {
        SUBCOMMANDS.put("produce", ProduceConsume::produce);
        SUBCOMMANDS.put("consume", ProduceConsume::consume);
        SUBCOMMANDS.put("produce-consume", ProduceConsume::produceConsume);
        SUBCOMMANDS.put("describe-cluster", ProduceConsume::describeCluster);
        SUBCOMMANDS.put("share-consume", ShareConsume::run);
        SUBCOMMANDS.put("admin-list-groups", AdminOps::listGroups);
        SUBCOMMANDS.put("admin-describe-share-groups", AdminOps::describeShareGroups);
        SUBCOMMANDS.put("admin-list-share-group-offsets", AdminOps::listShareGroupOffsets);
        SUBCOMMANDS.put("admin-alter-share-group-offsets", AdminOps::alterShareGroupOffsets);
        SUBCOMMANDS.put("admin-delete-share-group-offsets", AdminOps::deleteShareGroupOffsets);
        SUBCOMMANDS.put("admin-delete-share-groups", AdminOps::deleteShareGroups);
        SUBCOMMANDS.put("admin-alter-group-configs", AdminOps::alterGroupConfigs);
        SUBCOMMANDS.put("admin-describe-group-configs", AdminOps::describeGroupConfigs);
    }

    private Main() {}

    public static void main(String[] argv) {
        // Before any logger exists: slf4j-simple reads its level once.
        String logLevel = System.getenv().getOrDefault("KSP_JAVA_LOG_LEVEL", "warn");
        System.setProperty("org.slf4j.simpleLogger.defaultLogLevel", logLevel);
        System.setProperty("org.slf4j.simpleLogger.showDateTime", "true");
        System.setProperty("org.slf4j.simpleLogger.dateTimeFormat", "HH:mm:ss.SSS");
        if (argv.length == 0 || !SUBCOMMANDS.containsKey(argv[0])) {
            System.err.println("usage: Main {" + String.join("|", SUBCOMMANDS.keySet()) + "} --bootstrap HOST:PORT ...");
            System.exit(2);
        }
        Args args;
        try {
            args = Args.parse(argv, 1);
        } catch (IllegalArgumentException error) {
            System.err.println(error.getMessage());
            System.exit(2);
            return;
        }
        try {
            Json summary = SUBCOMMANDS.get(argv[0]).run(args);
            System.out.println(summary.put("command", argv[0]).render());
            System.out.flush();
            System.exit(0);
        } catch (Exception error) {
            System.out.println(new Json().put("command", argv[0]).put("error", String.valueOf(error)).render());
            error.printStackTrace();
            System.exit(1);
        }
    }
}
