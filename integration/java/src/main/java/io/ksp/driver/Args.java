package io.ksp.driver;

import java.io.IOException;
import java.io.Reader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;

/**
 * {@code --name value} pairs; every flag takes exactly one value. {@code --property key=value}
 * may repeat; it and {@code --command-config FILE} (a Java properties file, as Kafka's CLI tools
 * take) are client settings applied last, over whatever the subcommand set, by
 * {@link #applyClientOverrides}: that is how tests pass security settings (SASL, TLS).
 */
final class Args {
    private final Map<String, String> values = new HashMap<>();
    private final List<String> properties = new ArrayList<>();

    static Args parse(String[] argv, int from) {
        Args args = new Args();
        for (int index = from; index < argv.length; index += 2) {
            String flag = argv[index];
            if (!flag.startsWith("--") || index + 1 >= argv.length) {
                throw new IllegalArgumentException("expected --flag value pairs, got " + flag);
            }
            String name = flag.substring(2);
            String value = argv[index + 1];
            if (name.equals("property")) {
                if (value.indexOf('=') <= 0) {
                    throw new IllegalArgumentException("--property takes key=value, got " + value);
                }
                args.properties.add(value);
            } else {
                args.values.put(name, value);
            }
        }
        return args;
    }

    String required(String name) {
        String value = values.get(name);
        if (value == null) {
            throw new IllegalArgumentException("--" + name + " is required");
        }
        return value;
    }

    String get(String name, String fallback) {
        return values.getOrDefault(name, fallback);
    }

    int getInt(String name, int fallback) {
        return values.containsKey(name) ? Integer.parseInt(values.get(name)) : fallback;
    }

    /** The --command-config file's settings, then every --property, over {@code config}; returns it. */
    Properties applyClientOverrides(Properties config) throws IOException {
        String file = values.get("command-config");
        if (file != null) {
            Properties fromFile = new Properties();
            try (Reader reader = Files.newBufferedReader(Path.of(file), StandardCharsets.UTF_8)) {
                fromFile.load(reader);
            }
            config.putAll(fromFile);
        }
        for (String property : properties) {
            int split = property.indexOf('=');
            config.put(property.substring(0, split), property.substring(split + 1));
        }
        return config;
    }
}
