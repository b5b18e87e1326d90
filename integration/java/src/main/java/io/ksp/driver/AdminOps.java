package io.ksp.driver;

import java.util.ArrayList;
import java.util.Collection;
import java.util.Comparator;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.AlterShareGroupOffsetsResult;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.DeleteShareGroupOffsetsResult;
import org.apache.kafka.clients.admin.DescribeShareGroupsOptions;
import org.apache.kafka.clients.admin.GroupListing;
import org.apache.kafka.clients.admin.ListGroupsOptions;
import org.apache.kafka.clients.admin.ListShareGroupOffsetsSpec;
import org.apache.kafka.clients.admin.ShareGroupDescription;
import org.apache.kafka.clients.admin.ShareMemberDescription;
import org.apache.kafka.clients.admin.SharePartitionOffsetInfo;
import org.apache.kafka.common.GroupState;
import org.apache.kafka.common.GroupType;
import org.apache.kafka.common.KafkaFuture;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.acl.AclOperation;
import org.apache.kafka.common.config.ConfigResource;

/**
 * The Java Admin client's share-group methods, one subcommand each, printing JSON.
 *
 * <p>Flags are {@code --name value}; lists are comma separated; partitions are {@code topic:partition}.
 * A failure of the call (or of one group, partition or topic in it) is reported in the JSON as
 * {@code {"class": <exception class>, "message": ...}} (the cause of Kafka's ExecutionException),
 * never as a stack trace, and the command still exits 0: the tests assert on the error classes.
 */
final class AdminOps {
    private static final int TIMEOUT_S = 30;

    private AdminOps() {}

    /** {@code admin-list-groups [--types share] [--states Stable,Empty]}: Admin.listGroups. */
    static Json listGroups(Args args) throws Exception {
        try (Admin admin = admin(args)) {
            ListGroupsOptions options = new ListGroupsOptions();
            if (!args.get("types", "").isEmpty()) {
                Set<GroupType> types = new LinkedHashSet<>();
                for (String type : list(args.get("types", ""))) {
                    types.add(GroupType.parse(type));
                }
                options = options.withTypes(types);
            }
            if (!args.get("states", "").isEmpty()) {
                Set<GroupState> states = new LinkedHashSet<>();
                for (String state : list(args.get("states", ""))) {
                    states.add(GroupState.parse(state));
                }
                options = options.inGroupStates(states);
            }
            Json out = new Json();
            try {
                List<Json> groups = new ArrayList<>();
                List<GroupListing> listings = new ArrayList<>(admin.listGroups(options).all().get(TIMEOUT_S, TimeUnit.SECONDS));
                listings.sort(Comparator.comparing(GroupListing::groupId));
                for (GroupListing listing : listings) {
                    groups.add(new Json()
                        .put("group", listing.groupId())
                        .put("type", listing.type().map(GroupType::toString).orElse(null))
                        .put("protocol", listing.protocol())
                        .put("state", listing.groupState().map(GroupState::toString).orElse(null)));
                }
                out.put("groups", groups);
            } catch (ExecutionException error) {
                out.put("error", error(error));
            }
            return out;
        }
    }

    /** {@code admin-describe-share-groups --groups g1,g2 [--include-authorized-operations true]}. */
    static Json describeShareGroups(Args args) throws Exception {
        try (Admin admin = admin(args)) {
            DescribeShareGroupsOptions options = new DescribeShareGroupsOptions()
                .includeAuthorizedOperations(Boolean.parseBoolean(args.get("include-authorized-operations", "false")));
            List<String> groupIds = list(args.required("groups"));
            Map<String, KafkaFuture<ShareGroupDescription>> futures =
                admin.describeShareGroups(groupIds, options).describedGroups();
            List<Json> groups = new ArrayList<>();
            for (String groupId : groupIds) {
                Json group = new Json().put("group", groupId);
                try {
                    ShareGroupDescription description = futures.get(groupId).get(TIMEOUT_S, TimeUnit.SECONDS);
                    List<Json> members = new ArrayList<>();
                    for (ShareMemberDescription member : description.members()) {
                        members.add(new Json()
                            .put("member_id", member.consumerId())
                            .put("client_id", member.clientId())
                            .put("host", member.host())
                            .put("rack", member.rackId().orElse(null))
                            .put("member_epoch", member.memberEpoch())
                            .put("assignment", partitions(member.assignment().topicPartitions())));
                    }
                    Set<AclOperation> operations = description.authorizedOperations();
                    group.put("state", String.valueOf(description.groupState()))
                        .put("group_epoch", description.groupEpoch())
                        .put("target_assignment_epoch", description.targetAssignmentEpoch())
                        .put("coordinator", description.coordinator() == null ? null : description.coordinator().id())
                        .put("authorized_operations", operations == null ? null : sortedNames(operations))
                        .put("members", members);
                } catch (ExecutionException error) {
                    group.put("error", error(error));
                }
                groups.add(group);
            }
            return new Json().put("groups", groups);
        }
    }

    /** {@code admin-list-share-group-offsets --group g [--partitions t:0,t:1]}: start offset, leader epoch, lag. */
    static Json listShareGroupOffsets(Args args) throws Exception {
        try (Admin admin = admin(args)) {
            String groupId = args.required("group");
            ListShareGroupOffsetsSpec spec = new ListShareGroupOffsetsSpec();
            if (!args.get("partitions", "").isEmpty()) {
                spec = spec.topicPartitions(topicPartitions(args.get("partitions", "")));
            }
            Json out = new Json().put("group", groupId);
            try {
                Map<TopicPartition, SharePartitionOffsetInfo> offsets = admin.listShareGroupOffsets(Map.of(groupId, spec))
                    .partitionsToOffsetInfo(groupId).get(TIMEOUT_S, TimeUnit.SECONDS);
                List<Json> rows = new ArrayList<>();
                List<TopicPartition> keys = new ArrayList<>(offsets.keySet());
                keys.sort(Comparator.comparing(TopicPartition::topic).thenComparing(TopicPartition::partition));
                for (TopicPartition partition : keys) {
                    SharePartitionOffsetInfo info = offsets.get(partition);
                    rows.add(new Json()
                        .put("topic", partition.topic())
                        .put("partition", partition.partition())
                        .put("start_offset", info == null ? null : info.startOffset())
                        .put("leader_epoch", info == null ? null : info.leaderEpoch().orElse(null))
                        .put("lag", info == null ? null : info.lag().orElse(null)));
                }
                out.put("offsets", rows);
            } catch (ExecutionException error) {
                out.put("error", error(error));
            }
            return out;
        }
    }

    /** {@code admin-alter-share-group-offsets --group g --offsets t:0=5,t:1=7}. */
    static Json alterShareGroupOffsets(Args args) throws Exception {
        try (Admin admin = admin(args)) {
            String groupId = args.required("group");
            Map<TopicPartition, Long> offsets = new LinkedHashMap<>();
            for (String entry : list(args.required("offsets"))) {
                String[] parts = entry.split("=", 2);
                offsets.put(topicPartition(parts[0]), Long.parseLong(parts[1]));
            }
            AlterShareGroupOffsetsResult result = admin.alterShareGroupOffsets(groupId, offsets);
            Json partitions = new Json();
            for (TopicPartition partition : offsets.keySet()) {
                partitions.put(partition.topic() + ":" + partition.partition(), outcome(result.partitionResult(partition)));
            }
            return new Json().put("group", groupId).put("all", outcome(result.all())).put("partitions", partitions);
        }
    }

    /** {@code admin-delete-share-group-offsets --group g --topics t1,t2}. */
    static Json deleteShareGroupOffsets(Args args) throws Exception {
        try (Admin admin = admin(args)) {
            String groupId = args.required("group");
            Set<String> topics = new LinkedHashSet<>(list(args.required("topics")));
            DeleteShareGroupOffsetsResult result = admin.deleteShareGroupOffsets(groupId, topics);
            Json perTopic = new Json();
            for (String topic : topics) {
                perTopic.put(topic, outcome(result.topicResult(topic)));
            }
            return new Json().put("group", groupId).put("all", outcome(result.all())).put("topics", perTopic);
        }
    }

    /** {@code admin-delete-share-groups --groups g1,g2}. */
    static Json deleteShareGroups(Args args) throws Exception {
        try (Admin admin = admin(args)) {
            List<String> groupIds = list(args.required("groups"));
            Map<String, KafkaFuture<Void>> deleted = admin.deleteShareGroups(groupIds).deletedGroups();
            Json groups = new Json();
            for (String groupId : groupIds) {
                groups.put(groupId, outcome(deleted.get(groupId)));
            }
            return new Json().put("groups", groups);
        }
    }

    /** {@code admin-alter-group-configs --group g [--set k=v,k2=v2] [--delete k3]}: incrementalAlterConfigs on GROUP g. */
    static Json alterGroupConfigs(Args args) throws Exception {
        try (Admin admin = admin(args)) {
            ConfigResource resource = new ConfigResource(ConfigResource.Type.GROUP, args.required("group"));
            List<AlterConfigOp> ops = new ArrayList<>();
            for (String entry : list(args.get("set", ""))) {
                String[] parts = entry.split("=", 2);
                ops.add(new AlterConfigOp(new ConfigEntry(parts[0], parts[1]), AlterConfigOp.OpType.SET));
            }
            for (String name : list(args.get("delete", ""))) {
                ops.add(new AlterConfigOp(new ConfigEntry(name, ""), AlterConfigOp.OpType.DELETE));
            }
            Map<ConfigResource, Collection<AlterConfigOp>> request = new HashMap<>();
            request.put(resource, ops);
            return new Json().put("group", resource.name())
                .put("result", outcome(admin.incrementalAlterConfigs(request).values().get(resource)));
        }
    }

    /** {@code admin-describe-group-configs --group g}: describeConfigs on GROUP g (name, value, source). */
    static Json describeGroupConfigs(Args args) throws Exception {
        try (Admin admin = admin(args)) {
            ConfigResource resource = new ConfigResource(ConfigResource.Type.GROUP, args.required("group"));
            Json out = new Json().put("group", resource.name());
            try {
                Config config = admin.describeConfigs(List.of(resource)).values().get(resource).get(TIMEOUT_S, TimeUnit.SECONDS);
                List<ConfigEntry> entries = new ArrayList<>(config.entries());
                entries.sort(Comparator.comparing(ConfigEntry::name));
                List<Json> configs = new ArrayList<>();
                for (ConfigEntry entry : entries) {
                    configs.add(new Json()
                        .put("name", entry.name())
                        .put("value", entry.value())
                        .put("source", String.valueOf(entry.source()))
                        .put("is_default", entry.isDefault())
                        .put("read_only", entry.isReadOnly())
                        .put("sensitive", entry.isSensitive()));
                }
                out.put("configs", configs);
            } catch (ExecutionException error) {
                out.put("error", error(error));
            }
            return out;
        }
    }

    // ----- helpers -----------------------------------------------------------------------------

    private static Admin admin(Args args) throws java.io.IOException {
        Properties config = new Properties();
        config.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args.required("bootstrap"));
        config.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, args.get("request-timeout-ms", "15000"));
        config.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, args.get("api-timeout-ms", "25000"));
        config.put(AdminClientConfig.CLIENT_ID_CONFIG, args.get("client-id", "ksp-admin-driver"));
        return Admin.create(args.applyClientOverrides(config));
    }

    /** null when the future completed, else {"class", "message"} of what it failed with. */
    private static Json outcome(KafkaFuture<Void> future) throws InterruptedException {
        if (future == null) {
            return new Json().put("class", "NoResult").put("message", "the Admin client returned no future for it");
        }
        try {
            future.get(TIMEOUT_S, TimeUnit.SECONDS);
            return null;
        } catch (ExecutionException error) {
            return error(error);
        } catch (java.util.concurrent.TimeoutException error) {
            return new Json().put("class", error.getClass().getSimpleName()).put("message", String.valueOf(error.getMessage()));
        }
    }

    private static Json error(ExecutionException error) {
        Throwable cause = error.getCause() == null ? error : error.getCause();
        return new Json().put("class", cause.getClass().getSimpleName()).put("message", String.valueOf(cause.getMessage()));
    }

    private static List<String> list(String text) {
        List<String> out = new ArrayList<>();
        for (String item : text.split(",")) {
            if (!item.isBlank()) {
                out.add(item.trim());
            }
        }
        return out;
    }

    private static TopicPartition topicPartition(String text) {
        int colon = text.lastIndexOf(':');
        if (colon < 0) {
            throw new IllegalArgumentException("expected topic:partition, got " + text);
        }
        return new TopicPartition(text.substring(0, colon), Integer.parseInt(text.substring(colon + 1)));
    }

    private static List<TopicPartition> topicPartitions(String text) {
        List<TopicPartition> out = new ArrayList<>();
        for (String item : list(text)) {
            out.add(topicPartition(item));
        }
        return out;
    }

    private static List<String> partitions(Collection<TopicPartition> partitions) {
        List<String> out = new ArrayList<>();
        for (TopicPartition partition : partitions) {
            out.add(partition.topic() + ":" + partition.partition());
        }
        out.sort(Comparator.naturalOrder());
        return out;
    }

    private static List<String> sortedNames(Set<AclOperation> operations) {
        List<String> out = new ArrayList<>();
        for (AclOperation operation : operations) {
            out.add(operation.name());
        }
        out.sort(Comparator.naturalOrder());
        return out;
    }
}
