package io.ksp.driver;

import java.util.HashMap;
import java.util.Map;

/** {@code --name value} pairs; every flag takes exactly one value. */
final class Args {
    private final Map<String, String> values = new HashMap<>();

    static Args parse(String[] argv, int from) {
        Args args = new Args();
        for (int index = from; index < argv.length; index += 2) {
            String flag = argv[index];
            if (!flag.startsWith("--") || index + 1 >= argv.length) {
                throw new IllegalArgumentException("expected --flag value pairs, got " + flag);
            }
            args.values.put(flag.substring(2), argv[index + 1]);
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
}
