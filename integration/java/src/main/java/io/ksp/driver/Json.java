package io.ksp.driver;

import java.util.Collection;
import java.util.LinkedHashMap;
import java.util.Map;

/** A small JSON object writer (strings, numbers, booleans, lists, nested objects) - enough for summaries. */
final class Json {
    private final Map<String, Object> fields = new LinkedHashMap<>();

    Json put(String name, Object value) {
        fields.put(name, value);
        return this;
    }

    String render() {
        StringBuilder out = new StringBuilder("{");
        boolean first = true;
        for (Map.Entry<String, Object> field : fields.entrySet()) {
            if (!first) {
                out.append(", ");
            }
            first = false;
            out.append(quote(field.getKey())).append(": ").append(value(field.getValue()));
        }
        return out.append('}').toString();
    }

    private static String value(Object value) {
        if (value == null) {
            return "null";
        }
        if (value instanceof Json nested) {
            return nested.render();
        }
        if (value instanceof Number || value instanceof Boolean) {
            return value.toString();
        }
        if (value instanceof Collection<?> items) {
            StringBuilder out = new StringBuilder("[");
            boolean first = true;
            for (Object item : items) {
                if (!first) {
                    out.append(", ");
                }
                first = false;
                out.append(value(item));
            }
            return out.append(']').toString();
        }
        return quote(value.toString());
    }

    private static String quote(String text) {
        StringBuilder out = new StringBuilder("\"");
        for (char c : text.toCharArray()) {
            switch (c) {
                case '"' -> out.append("\\\"");
                case '\\' -> out.append("\\\\");
                case '\n' -> out.append("\\n");
                case '\r' -> out.append("\\r");
                case '\t' -> out.append("\\t");
                default -> {
                    if (c < 0x20) {
                        out.append(String.format("\\u%04x", (int) c));
                    } else {
                        out.append(c);
                    }
                }
            }
        }
        return out.append('"').toString();
    }
}
