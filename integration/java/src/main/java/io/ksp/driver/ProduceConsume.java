package io.ksp.driver;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.BitSet;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.DescribeClusterResult;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * Produce N numbered records (key, value and headers derived from the index) and read them back
 * with a consumer group, checking every record's key, value, headers and per-partition order.
 *
 * <p>Record i: key {@code key-i}, value {@code value-i}, headers {@code index=i} and
 * {@code source=java-driver}.
 */
final class ProduceConsume {
    private ProduceConsume() {}

    static Json produceConsume(Args args) throws Exception {
        Json summary = produce(args);
        Json consumed = consume(args);
        return summary.put("consume", consumed);
    }

    static Json produce(Args args) throws Exception {
        String topic = args.required("topic");
        int count = args.getInt("count", 1000);
        Properties config = common(args);
        config.put(ProducerConfig.ACKS_CONFIG, "all");
        config.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        config.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        config.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, args.get("compression", "none"));
        config.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        config.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        AtomicInteger acked = new AtomicInteger();
        AtomicInteger failed = new AtomicInteger();
        AtomicReference<String> firstError = new AtomicReference<>();
        long started = System.nanoTime();
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(args.applyClientOverrides(config))) {
            for (int index = 0; index < count; index++) {
                ProducerRecord<String, String> record = new ProducerRecord<>(topic, "key-" + index, "value-" + index);
                record.headers().add("index", Integer.toString(index).getBytes(StandardCharsets.UTF_8));
                record.headers().add("source", "java-driver".getBytes(StandardCharsets.UTF_8));
                producer.send(record, (metadata, error) -> {
                    if (error == null) {
                        acked.incrementAndGet();
                    } else {
                        failed.incrementAndGet();
                        firstError.compareAndSet(null, error.toString());
                    }
                });
            }
            producer.flush();
        }
        return new Json()
                .put("topic", topic)
                .put("produced", acked.get())
                .put("produce_errors", failed.get())
                .put("first_error", firstError.get())
                .put("produce_ms", TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - started));
    }

    static Json consume(Args args) throws Exception {
        String topic = args.required("topic");
        int count = args.getInt("count", 1000);
        long timeoutMs = args.getInt("timeout-ms", 60000);
        Properties config = common(args);
        config.put(ConsumerConfig.GROUP_ID_CONFIG, args.get("group", "java-driver-" + topic));
        config.put(ConsumerConfig.GROUP_PROTOCOL_CONFIG, args.get("group-protocol", "classic"));
        config.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        config.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        config.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        config.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        BitSet seen = new BitSet(count);
        int received = 0;
        int duplicates = 0;
        int badRecords = 0;
        int orderViolations = 0;
        Map<Integer, Integer> lastIndexByPartition = new HashMap<>();
        long started = System.nanoTime();
        long deadline = started + TimeUnit.MILLISECONDS.toNanos(timeoutMs);
        boolean committed = false;
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(args.applyClientOverrides(config))) {
            consumer.subscribe(List.of(topic));
            while (seen.cardinality() < count && System.nanoTime() < deadline) {
                for (ConsumerRecord<String, String> record : consumer.poll(Duration.ofMillis(200))) {
                    received++;
                    int index = headerIndex(record);
                    if (index < 0 || index >= count || !isWellFormed(record, index)) {
                        badRecords++;
                        continue;
                    }
                    if (seen.get(index)) {
                        duplicates++;
                    }
                    seen.set(index);
                    Integer previous = lastIndexByPartition.put(record.partition(), index);
                    if (previous != null && previous >= index) {
                        orderViolations++;
                    }
                }
            }
            consumer.commitSync(Duration.ofSeconds(30));
            committed = true;
        }
        return new Json()
                .put("topic", topic)
                .put("received", received)
                .put("unique", seen.cardinality())
                .put("missing", count - seen.cardinality())
                .put("duplicates", duplicates)
                .put("bad_records", badRecords)
                .put("order_violations", orderViolations)
                .put("committed", committed)
                .put("consume_ms", TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - started));
    }

    /** The nodes the Java client learns about through {@code --bootstrap} (for endpoint checks). */
    static Json describeCluster(Args args) throws Exception {
        Properties config = common(args);
        try (Admin admin = Admin.create(args.applyClientOverrides(config))) {
            DescribeClusterResult cluster = admin.describeCluster();
            List<String> nodes = new ArrayList<>();
            for (Node node : cluster.nodes().get(30, TimeUnit.SECONDS)) {
                nodes.add(node.id() + "@" + node.host() + ":" + node.port());
            }
            Node controller = cluster.controller().get(30, TimeUnit.SECONDS);
            return new Json()
                    .put("cluster_id", cluster.clusterId().get(30, TimeUnit.SECONDS))
                    .put("nodes", nodes)
                    .put("controller", controller.host() + ":" + controller.port());
        }
    }

    private static Properties common(Args args) {
        Properties config = new Properties();
        config.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args.required("bootstrap"));
        config.put(AdminClientConfig.CLIENT_ID_CONFIG, args.get("client-id", "ksp-java-driver"));
        return config;
    }

    private static int headerIndex(ConsumerRecord<String, String> record) {
        Header header = record.headers().lastHeader("index");
        if (header == null) {
            return -1;
        }
        try {
            return Integer.parseInt(new String(header.value(), StandardCharsets.UTF_8));
        } catch (NumberFormatException error) {
            return -1;
        }
    }

    private static boolean isWellFormed(ConsumerRecord<String, String> record, int index) {
        Header source = record.headers().lastHeader("source");
        return ("key-" + index).equals(record.key())
                && ("value-" + index).equals(record.value())
                && source != null
                && "java-driver".equals(new String(source.value(), StandardCharsets.UTF_8));
    }
}
