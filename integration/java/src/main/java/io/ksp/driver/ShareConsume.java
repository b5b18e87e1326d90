package io.ksp.driver;

import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.consumer.AcknowledgeType;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaShareConsumer;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.serialization.StringDeserializer;

/**
 * A {@link KafkaShareConsumer} that consumes a topic and reports what it was given.
 *
 * <p>Flags: {@code --bootstrap --group --topic}; {@code --count N} stops once N distinct records
 * are finished (accepted or rejected), then polls {@code --linger-ms} more to catch late
 * redeliveries; {@code --idle-stop-ms M} (for consumers sharing a group with others) stops after M
 * ms without records once any arrived; {@code --timeout-ms} bounds the run; {@code --process-ms}
 * sleeps after every non-empty poll before acknowledging (slow work). Client settings:
 * {@code --ack-mode implicit|explicit}, {@code --acquire-mode batch_optimized|record_limit},
 * {@code --max-poll-records}, {@code --commit none|sync|async} (none: acknowledgements ride on the
 * next ShareFetch; sync/async: ShareAcknowledge after every poll). Explicit-mode behaviour:
 * {@code --renew true} renews every record once (AcknowledgeType.RENEW) and accepts it when the
 * client hands it back; {@code --release P:O,...} releases those records on their first delivery;
 * {@code --reject P:O,...} rejects them; {@code --release-always P:O,...} releases those records on
 * every delivery (so they reach the group's delivery count limit), counting one finished when it
 * is released at delivery {@code --delivery-limit L}; {@code --abandon-after-polls N} closes right after the Nth
 * non-empty poll leaving its records unacknowledged (reported as "abandoned", not "deliveries").
 */
final class ShareConsume {
    private ShareConsume() {}

    /** What happened to one record so far, from this consumer's point of view. */
    private enum Fate { RENEWING, RELEASED, ACCEPTED, REJECTED }

    static Json run(Args args) throws Exception {
        String topic = args.required("topic");
        int expected = args.getInt("count", 0);
        long timeoutMs = args.getInt("timeout-ms", 60000);
        long lingerMs = args.getInt("linger-ms", 1000);
        long idleStopMs = args.getInt("idle-stop-ms", 0);
        long pollMs = args.getInt("poll-ms", 500);
        long processMs = args.getInt("process-ms", 0);
        int abandonAfterPolls = args.getInt("abandon-after-polls", 0);
        String ackMode = args.get("ack-mode", "implicit");
        String acquireMode = args.get("acquire-mode", "batch_optimized");
        int maxPollRecords = args.getInt("max-poll-records", ConsumerConfig.DEFAULT_MAX_POLL_RECORDS);
        String commit = args.get("commit", "none");
        boolean explicit = "explicit".equals(ackMode);
        boolean renew = Boolean.parseBoolean(args.get("renew", "false"));
        Set<String> toRelease = keys(args.get("release", ""));
        Set<String> toReject = keys(args.get("reject", ""));
        Set<String> toReleaseAlways = keys(args.get("release-always", ""));
        int deliveryLimit = args.getInt("delivery-limit", 0);
        if (!explicit && (renew || !toRelease.isEmpty() || !toReject.isEmpty() || !toReleaseAlways.isEmpty())) {
            throw new IllegalArgumentException("--renew, --release, --release-always and --reject need --ack-mode explicit");
        }

        Properties config = new Properties();
        config.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, args.required("bootstrap"));
        config.put(ConsumerConfig.CLIENT_ID_CONFIG, args.get("client-id", "ksp-java-share-driver"));
        config.put(ConsumerConfig.GROUP_ID_CONFIG, args.required("group"));
        config.put(ConsumerConfig.SHARE_ACKNOWLEDGEMENT_MODE_CONFIG, ackMode);
        config.put(ConsumerConfig.SHARE_ACQUIRE_MODE_CONFIG, acquireMode);
        config.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, Integer.toString(maxPollRecords));
        config.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        config.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());

        Map<String, Fate> fates = new HashMap<>();
        List<List<Object>> deliveries = new ArrayList<>();
        List<List<Object>> abandoned = new ArrayList<>();
        List<Integer> pollSizes = new ArrayList<>();
        List<String> ackErrors = new ArrayList<>();
        Map<String, Integer> callbackOffsets = new TreeMap<>();
        int finished = 0;
        int duplicates = 0;
        int renewReturns = 0;
        int renewConfirmed = 0;
        int released = 0;
        int rejected = 0;
        int[] callbackState = new int[2]; // [acknowledged offsets reported ok, renewals reported ok]
        Set<String> renewSent = new HashSet<>();
        Map<String, Long> firstSeenAt = new HashMap<>();
        long maxHoldNanos = 0;

        long started = System.nanoTime();
        long deadline = started + TimeUnit.MILLISECONDS.toNanos(timeoutMs);
        long lingerUntil = Long.MAX_VALUE;
        long lastRecordAt = 0;
        boolean closedCleanly = false;
        int lockTimeoutMs = -1;
        KafkaShareConsumer<String, String> consumer = new KafkaShareConsumer<>(args.applyClientOverrides(config));
        try {
            consumer.setAcknowledgementCommitCallback((offsets, error) -> {
                for (Map.Entry<TopicIdPartition, Set<Long>> entry : offsets.entrySet()) {
                    int partition = entry.getKey().partition();
                    if (error != null) {
                        ackErrors.add("partition " + partition + " offsets " + ranges(entry.getValue()) + ": " + error);
                        continue;
                    }
                    callbackOffsets.merge(Integer.toString(partition), entry.getValue().size(), Integer::sum);
                    for (long offset : entry.getValue()) {
                        callbackState[0]++;
                        if (renewSent.remove(partition + ":" + offset)) {
                            callbackState[1]++;
                        }
                    }
                }
            });
            consumer.subscribe(List.of(topic));
            while (System.nanoTime() < deadline && System.nanoTime() < lingerUntil) {
                ConsumerRecords<String, String> records = consumer.poll(Duration.ofMillis(pollMs));
                long now = System.nanoTime();
                if (records.count() > 0) {
                    pollSizes.add(records.count());
                    lastRecordAt = now;
                    if (processMs > 0) {
                        Thread.sleep(processMs); // slow work: holds the acquisition locks
                    }
                    if (pollSizes.size() == abandonAfterPolls) {
                        for (ConsumerRecord<String, String> record : records) {
                            int deliveryCount = record.deliveryCount().map(Short::intValue).orElse(-1);
                            abandoned.add(List.of(record.partition(), record.offset(), deliveryCount, String.valueOf(record.value())));
                        }
                        break; // close with these records unacknowledged: the proxy must release them
                    }
                }
                for (ConsumerRecord<String, String> record : records) {
                    String key = record.partition() + ":" + record.offset();
                    int deliveryCount = record.deliveryCount().map(Short::intValue).orElse(-1);
                    deliveries.add(List.of(record.partition(), record.offset(), deliveryCount, String.valueOf(record.value())));
                    Fate fate = fates.get(key);
                    firstSeenAt.putIfAbsent(key, now);
                    if (fate == Fate.ACCEPTED || fate == Fate.REJECTED) {
                        duplicates++;
                    }
                    if (!explicit) {
                        if (fate == null) {
                            finished++;
                        }
                        fates.put(key, Fate.ACCEPTED); // acknowledged by the next poll, commit or close
                        continue;
                    }
                    AcknowledgeType type;
                    if (fate == Fate.RENEWING) {
                        renewReturns++; // the client hands a renewed record back to be finished
                        type = AcknowledgeType.ACCEPT;
                    } else if (toReleaseAlways.contains(key)) {
                        type = AcknowledgeType.RELEASE; // every time, until the delivery limit archives it
                    } else if (fate == null && renew) {
                        type = AcknowledgeType.RENEW;
                    } else if (fate == null && toRelease.contains(key)) {
                        type = AcknowledgeType.RELEASE;
                    } else if (fate == null && toReject.contains(key)) {
                        type = AcknowledgeType.REJECT;
                    } else {
                        type = AcknowledgeType.ACCEPT;
                    }
                    consumer.acknowledge(record, type);
                    switch (type) {
                        case RENEW -> {
                            renewSent.add(key);
                            fates.put(key, Fate.RENEWING);
                        }
                        case RELEASE -> {
                            released++;
                            fates.put(key, Fate.RELEASED);
                            if (toReleaseAlways.contains(key) && deliveryCount == deliveryLimit) {
                                finished++; // archived at the limit: never delivered again
                            }
                        }
                        case REJECT -> {
                            rejected++;
                            finished++;
                            fates.put(key, Fate.REJECTED);
                        }
                        default -> {
                            if (fate != Fate.ACCEPTED && fate != Fate.REJECTED) {
                                finished++;
                            }
                            // From first delivery to acceptance (after any renewal and processing).
                            maxHoldNanos = Math.max(maxHoldNanos, System.nanoTime() - firstSeenAt.get(key));
                            fates.put(key, Fate.ACCEPTED);
                        }
                    }
                }
                if (records.count() > 0 || !renewSent.isEmpty()) {
                    commit(consumer, commit, ackErrors);
                }
                if (expected > 0 && finished >= expected && lingerUntil == Long.MAX_VALUE) {
                    lingerUntil = now + TimeUnit.MILLISECONDS.toNanos(lingerMs);
                }
                if (idleStopMs > 0 && lastRecordAt != 0 && now - lastRecordAt > TimeUnit.MILLISECONDS.toNanos(idleStopMs)) {
                    break;
                }
            }
            if (abandoned.isEmpty()) {
                commit(consumer, "sync", ackErrors);
            }
            lockTimeoutMs = consumer.acquisitionLockTimeoutMs().orElse(-1);
        } finally {
            consumer.close(Duration.ofSeconds(30));
            closedCleanly = true;
        }
        renewConfirmed = callbackState[1];

        Map<String, Integer> perPartition = new TreeMap<>();
        for (List<Object> delivery : deliveries) {
            perPartition.merge(delivery.get(0).toString(), 1, Integer::sum);
        }
        return new Json()
                .put("topic", topic)
                .put("ack_mode", ackMode)
                .put("acquire_mode", acquireMode)
                .put("max_poll_records", maxPollRecords)
                .put("received", deliveries.size())
                .put("unique", fates.size())
                .put("finished", finished)
                .put("duplicates", duplicates)
                .put("renew_returns", renewReturns)
                .put("renew_confirmed", renewConfirmed)
                .put("released", released)
                .put("rejected", rejected)
                .put("polls_with_records", pollSizes.size())
                .put("max_poll_size", pollSizes.stream().mapToInt(Integer::intValue).max().orElse(0))
                .put("poll_sizes", pollSizes)
                .put("per_partition", perPartition.entrySet().stream().map(e -> e.getKey() + "=" + e.getValue()).toList())
                .put("acquisition_lock_timeout_ms", lockTimeoutMs)
                .put("max_hold_ms", TimeUnit.NANOSECONDS.toMillis(maxHoldNanos))
                .put("callback_acknowledged", callbackState[0])
                .put("ack_errors", ackErrors)
                .put("closed_cleanly", closedCleanly)
                .put("consume_ms", TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - started))
                .put("deliveries", deliveries)
                .put("abandoned", abandoned);
    }

    /** Send pending acknowledgements now (ShareAcknowledge) unless they should ride on the next poll. */
    private static void commit(KafkaShareConsumer<String, String> consumer, String how, List<String> ackErrors) {
        switch (how) {
            case "sync" -> {
                Map<TopicIdPartition, Optional<KafkaException>> results = consumer.commitSync(Duration.ofSeconds(30));
                results.forEach((partition, error) ->
                        error.ifPresent(e -> ackErrors.add("commitSync " + partition.partition() + ": " + e)));
            }
            case "async" -> consumer.commitAsync();
            case "none" -> { }
            default -> throw new IllegalArgumentException("--commit must be none, sync or async, got " + how);
        }
    }

    /** Offsets as compact ranges, e.g. {@code [0-499, 700]}. */
    private static String ranges(Set<Long> offsets) {
        List<String> out = new ArrayList<>();
        long first = -1;
        long last = -1;
        for (long offset : new java.util.TreeSet<>(offsets)) {
            if (first >= 0 && offset == last + 1) {
                last = offset;
                continue;
            }
            if (first >= 0) {
                out.add(first == last ? Long.toString(first) : first + "-" + last);
            }
            first = offset;
            last = offset;
        }
        if (first >= 0) {
            out.add(first == last ? Long.toString(first) : first + "-" + last);
        }
        return out.toString();
    }

    /** {@code "0:5,1:7"} -> {"0:5", "1:7"}; a bare offset means partition 0. */
    private static Set<String> keys(String list) {
        Set<String> keys = new HashSet<>();
        for (String item : list.split(",")) {
            String trimmed = item.trim();
            if (!trimmed.isEmpty()) {
                keys.add(trimmed.contains(":") ? trimmed : "0:" + trimmed);
            }
        }
        return keys;
    }
}
