package golden;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.common.compress.Compression;
import org.apache.kafka.common.message.ShareAcknowledgeRequestData;
import org.apache.kafka.common.message.ShareAcknowledgeRequestDataJsonConverter;
import org.apache.kafka.common.message.ShareAcknowledgeResponseData;
import org.apache.kafka.common.message.ShareAcknowledgeResponseDataJsonConverter;
import org.apache.kafka.common.message.ShareFetchRequestData;
import org.apache.kafka.common.message.ShareFetchRequestDataJsonConverter;
import org.apache.kafka.common.message.ShareFetchResponseData;
import org.apache.kafka.common.message.ShareFetchResponseDataJsonConverter;
import org.apache.kafka.common.protocol.ApiMessage;
import org.apache.kafka.common.protocol.ByteBufferAccessor;
import org.apache.kafka.common.protocol.Message;
import org.apache.kafka.common.protocol.MessageUtil;
import org.apache.kafka.common.protocol.types.RawTaggedField;
import org.apache.kafka.common.record.internal.MemoryRecords;
import org.apache.kafka.common.record.internal.RecordBatch;
import org.apache.kafka.common.record.internal.SimpleRecord;
import org.apache.kafka.coordinator.common.runtime.CoordinatorRecord;
import org.apache.kafka.coordinator.share.ShareCoordinatorRecordSerde;
import org.apache.kafka.coordinator.share.generated.ShareSnapshotKey;
import org.apache.kafka.coordinator.share.generated.ShareSnapshotKeyJsonConverter;
import org.apache.kafka.coordinator.share.generated.ShareSnapshotValue;
import org.apache.kafka.coordinator.share.generated.ShareSnapshotValueJsonConverter;
import org.apache.kafka.coordinator.share.generated.ShareUpdateKey;
import org.apache.kafka.coordinator.share.generated.ShareUpdateKeyJsonConverter;
import org.apache.kafka.coordinator.share.generated.ShareUpdateValue;
import org.apache.kafka.coordinator.share.generated.ShareUpdateValueJsonConverter;
import org.apache.kafka.server.common.ApiMessageAndVersion;

import java.nio.ByteBuffer;
import java.util.HexFormat;
import java.util.List;

/**
 * Golden driver. {@code emit}: Kafka serializes the fixed inputs (mirrored in
 * integration/golden/cases.py) and prints {case: hex}. {@code parse CASE KEYHEX [VALUEHEX]}:
 * Kafka parses bytes produced by our codec and prints its view as JSON, plus the bytes
 * it writes back out.
 */
public final class Golden {
    static final ObjectMapper MAPPER = new ObjectMapper();
    static final HexFormat HEX = HexFormat.of();
    static final Uuid TOPIC = Uuid.fromString("AAAAAAAAAAAAAAAAAAAAAQ");   // 00..01
    static final Uuid OTHER_TOPIC = Uuid.fromString("AAAAAAAAAAAAAAAAAAAAAg"); // 00..02
    static final String GROUP = "golden-group";

    public static void main(String[] args) throws Exception {
        ObjectNode out = MAPPER.createObjectNode();
        switch (args[0]) {
            case "emit" -> emit(out);
            case "parse" -> parse(out, args[1], args[2], args.length > 3 ? args[3] : null);
            default -> throw new IllegalArgumentException("unknown command " + args[0]);
        }
        System.out.println(MAPPER.writeValueAsString(out));
    }

    static String hex(Message message, short version) {
        ByteBuffer buffer = MessageUtil.toByteBufferAccessor(message, version).buffer();
        return HEX.formatHex(MessageUtil.byteBufferToArray(buffer));
    }

    // -- fixed inputs ------------------------------------------------------------------

    static MemoryRecords fixedRecords() {
        return MemoryRecords.withRecords(
            10L, Compression.NONE, 0,
            new SimpleRecord(1_700_000_000_000L, "k1".getBytes(), "v1".getBytes()),
            new SimpleRecord(1_700_000_000_001L, null, "v2".getBytes()));
    }

    static ShareFetchRequestData shareFetchRequest(short version) {
        ShareFetchRequestData data = new ShareFetchRequestData()
            .setGroupId(GROUP).setMemberId("member-1").setShareSessionEpoch(3)
            .setMaxWaitMs(500).setMinBytes(1).setMaxBytes(1_048_576).setMaxRecords(500).setBatchSize(100);
        if (version >= 2) data.setShareAcquireMode((byte) 1).setIsRenewAck(true);
        ShareFetchRequestData.FetchTopic topic = new ShareFetchRequestData.FetchTopic().setTopicId(TOPIC);
        topic.partitions().add(new ShareFetchRequestData.FetchPartition().setPartitionIndex(0)
            .setAcknowledgementBatches(List.of(new ShareFetchRequestData.AcknowledgementBatch()
                .setFirstOffset(10).setLastOffset(12).setAcknowledgeTypes(List.of((byte) 1, (byte) 2, (byte) 3)))));
        topic.partitions().add(new ShareFetchRequestData.FetchPartition().setPartitionIndex(1));
        data.topics().add(topic);
        data.setForgottenTopicsData(List.of(new ShareFetchRequestData.ForgottenTopic()
            .setTopicId(OTHER_TOPIC).setPartitions(List.of(4, 5))));
        return data;
    }

    static ShareFetchResponseData shareFetchResponse(short version) {
        ShareFetchResponseData data = new ShareFetchResponseData()
            .setThrottleTimeMs(7).setErrorCode((short) 0).setErrorMessage(null).setAcquisitionLockTimeoutMs(30_000);
        ShareFetchResponseData.ShareFetchableTopicResponse topic =
            new ShareFetchResponseData.ShareFetchableTopicResponse().setTopicId(TOPIC);
        topic.partitions().add(new ShareFetchResponseData.PartitionData().setPartitionIndex(0)
            .setErrorCode((short) 0).setAcknowledgeErrorCode((short) 0)
            .setCurrentLeader(new ShareFetchResponseData.LeaderIdAndEpoch().setLeaderId(1).setLeaderEpoch(5))
            .setRecords(fixedRecords())
            .setAcquiredRecords(List.of(new ShareFetchResponseData.AcquiredRecords()
                .setFirstOffset(10).setLastOffset(11).setDeliveryCount((short) 1))));
        data.responses().add(topic);
        data.nodeEndpoints().add(new ShareFetchResponseData.NodeEndpoint()
            .setNodeId(1).setHost("localhost").setPort(9092).setRack(null));
        return data;
    }

    static ShareAcknowledgeRequestData shareAcknowledgeRequest(short version) {
        ShareAcknowledgeRequestData data = new ShareAcknowledgeRequestData()
            .setGroupId(GROUP).setMemberId("member-1").setShareSessionEpoch(4);
        ShareAcknowledgeRequestData.AcknowledgeTopic topic =
            new ShareAcknowledgeRequestData.AcknowledgeTopic().setTopicId(TOPIC);
        topic.partitions().add(new ShareAcknowledgeRequestData.AcknowledgePartition().setPartitionIndex(0)
            .setAcknowledgementBatches(List.of(
                new ShareAcknowledgeRequestData.AcknowledgementBatch()
                    .setFirstOffset(10).setLastOffset(12).setAcknowledgeTypes(List.of((byte) 1)),
                new ShareAcknowledgeRequestData.AcknowledgementBatch()
                    .setFirstOffset(13).setLastOffset(13).setAcknowledgeTypes(List.of((byte) 0)))));
        data.topics().add(topic);
        return data;
    }

    static ShareAcknowledgeResponseData shareAcknowledgeResponse(short version) {
        ShareAcknowledgeResponseData data = new ShareAcknowledgeResponseData()
            .setThrottleTimeMs(0).setErrorCode((short) 0);
        if (version >= 2) data.setAcquisitionLockTimeoutMs(15_000);
        ShareAcknowledgeResponseData.ShareAcknowledgeTopicResponse topic =
            new ShareAcknowledgeResponseData.ShareAcknowledgeTopicResponse().setTopicId(TOPIC);
        topic.partitions().add(new ShareAcknowledgeResponseData.PartitionData().setPartitionIndex(0)
            .setErrorCode((short) 0)
            .setCurrentLeader(new ShareAcknowledgeResponseData.LeaderIdAndEpoch().setLeaderId(1).setLeaderEpoch(5)));
        data.responses().add(topic);
        return data;
    }

    static CoordinatorRecord shareSnapshot() {
        ShareSnapshotValue value = new ShareSnapshotValue()
            .setSnapshotEpoch(2).setStateEpoch(1).setLeaderEpoch(5).setStartOffset(10).setDeliveryCompleteCount(3)
            .setCreateTimestamp(1_700_000_000_000L).setWriteTimestamp(1_700_000_001_000L)
            .setStateBatches(List.of(
                new ShareSnapshotValue.StateBatch().setFirstOffset(10).setLastOffset(12)
                    .setDeliveryState((byte) 2).setDeliveryCount((short) 1),
                new ShareSnapshotValue.StateBatch().setFirstOffset(13).setLastOffset(20)
                    .setDeliveryState((byte) 0).setDeliveryCount((short) 2)));
        return CoordinatorRecord.record(
            new ShareSnapshotKey().setGroupId(GROUP).setTopicId(TOPIC).setPartition(0),
            new ApiMessageAndVersion(value, (short) 0));
    }

    static CoordinatorRecord shareUpdate() {
        ShareUpdateValue value = new ShareUpdateValue()
            .setSnapshotEpoch(2).setLeaderEpoch(5).setStartOffset(-1)
            .setStateBatches(List.of(new ShareUpdateValue.StateBatch().setFirstOffset(13).setLastOffset(13)
                .setDeliveryState((byte) 4).setDeliveryCount((short) 3)));
        return CoordinatorRecord.record(
            new ShareUpdateKey().setGroupId(GROUP).setTopicId(TOPIC).setPartition(0),
            new ApiMessageAndVersion(value, (short) 0));
    }

    static void emit(ObjectNode out) {
        for (short v = 1; v <= 2; v++) {
            out.put("share_fetch_request_v" + v, hex(shareFetchRequest(v), v));
            out.put("share_fetch_response_v" + v, hex(shareFetchResponse(v), v));
            out.put("share_acknowledge_request_v" + v, hex(shareAcknowledgeRequest(v), v));
            out.put("share_acknowledge_response_v" + v, hex(shareAcknowledgeResponse(v), v));
        }
        out.put("fixed_records", HEX.formatHex(MessageUtil.byteBufferToArray(fixedRecords().buffer())));
        ShareCoordinatorRecordSerde serde = new ShareCoordinatorRecordSerde();
        for (var entry : List.of(List.of("share_snapshot", shareSnapshot()), List.of("share_update", shareUpdate()))) {
            CoordinatorRecord record = (CoordinatorRecord) entry.get(1);
            out.put(entry.get(0) + "_key", HEX.formatHex(serde.serializeKey(record)));
            out.put(entry.get(0) + "_value", HEX.formatHex(serde.serializeValue(record)));
            out.put(entry.get(0) + "_tombstone_key",
                HEX.formatHex(serde.serializeKey(CoordinatorRecord.tombstone(record.key()))));
        }
    }

    // -- parsing our bytes -------------------------------------------------------------

    static void parse(ObjectNode out, String kind, String firstHex, String secondHex) {
        byte[] first = HEX.parseHex(firstHex);
        if (kind.startsWith("share_state")) {
            parseStateRecord(out, first, secondHex == null ? null : HEX.parseHex(secondHex));
            return;
        }
        short version = Short.parseShort(kind.substring(kind.lastIndexOf('v') + 1));
        ByteBufferAccessor accessor = new ByteBufferAccessor(ByteBuffer.wrap(first));
        Message message;
        JsonNode json;
        if (kind.startsWith("share_fetch_request")) {
            var data = new ShareFetchRequestData(accessor, version);
            message = data; json = ShareFetchRequestDataJsonConverter.write(data, version);
        } else if (kind.startsWith("share_fetch_response")) {
            var data = new ShareFetchResponseData(accessor, version);
            message = data; json = ShareFetchResponseDataJsonConverter.write(data, version);
            ArrayNode batches = out.putArray("batches");
            for (var topic : data.responses()) {
                for (var partition : topic.partitions()) {
                    MemoryRecords records = (MemoryRecords) partition.records();
                    for (RecordBatch batch : records.batches()) {
                        batch.ensureValid(); // CRC check by Kafka
                        ObjectNode b = batches.addObject();
                        b.put("baseOffset", batch.baseOffset());
                        b.put("lastOffset", batch.lastOffset());
                        b.put("count", batch.countOrNull());
                        b.put("isControl", batch.isControlBatch());
                        b.put("isTransactional", batch.isTransactional());
                        b.put("producerId", batch.producerId());
                        b.put("maxTimestamp", batch.maxTimestamp());
                    }
                }
            }
        } else if (kind.startsWith("share_acknowledge_request")) {
            var data = new ShareAcknowledgeRequestData(accessor, version);
            message = data; json = ShareAcknowledgeRequestDataJsonConverter.write(data, version);
        } else if (kind.startsWith("share_acknowledge_response")) {
            var data = new ShareAcknowledgeResponseData(accessor, version);
            message = data; json = ShareAcknowledgeResponseDataJsonConverter.write(data, version);
        } else {
            throw new IllegalArgumentException("unknown case " + kind);
        }
        out.put("remaining", accessor.buffer().remaining());
        out.set("parsed", json);
        out.put("reserialized", hex(message, version));
    }

    static ArrayNode unknownTags(ObjectNode out, String name, List<RawTaggedField> fields) {
        ArrayNode tags = out.withArray(name);
        for (RawTaggedField field : fields) {
            ObjectNode tag = tags.addObject();
            tag.put("tag", field.tag());
            tag.put("data", HEX.formatHex(field.data()));
        }
        return tags;
    }

    static void parseStateRecord(ObjectNode out, byte[] key, byte[] value) {
        ShareCoordinatorRecordSerde serde = new ShareCoordinatorRecordSerde();
        CoordinatorRecord record = serde.deserialize(ByteBuffer.wrap(key), value == null ? null : ByteBuffer.wrap(value));
        ApiMessage keyMessage = record.key();
        out.put("keyType", keyMessage.apiKey());
        out.put("reserializedKey", HEX.formatHex(serde.serializeKey(record)));
        if (keyMessage instanceof ShareSnapshotKey k) out.set("key", ShareSnapshotKeyJsonConverter.write(k, (short) 0));
        if (keyMessage instanceof ShareUpdateKey k) out.set("key", ShareUpdateKeyJsonConverter.write(k, (short) 0));
        if (record.value() == null) {
            out.putNull("value");
            return;
        }
        out.put("valueVersion", record.value().version());
        out.put("reserializedValue", HEX.formatHex(serde.serializeValue(record)));
        ApiMessage message = record.value().message();
        if (message instanceof ShareSnapshotValue v) {
            out.set("value", ShareSnapshotValueJsonConverter.write(v, (short) 0));
            unknownTags(out, "valueUnknownTags", v.unknownTaggedFields());
            ArrayNode perBatch = out.putArray("batchUnknownTags");
            for (var batch : v.stateBatches()) unknownTags(perBatch.addObject(), "tags", batch.unknownTaggedFields());
        } else if (message instanceof ShareUpdateValue v) {
            out.set("value", ShareUpdateValueJsonConverter.write(v, (short) 0));
            unknownTags(out, "valueUnknownTags", v.unknownTaggedFields());
            ArrayNode perBatch = out.putArray("batchUnknownTags");
            for (var batch : v.stateBatches()) unknownTags(perBatch.addObject(), "tags", batch.unknownTaggedFields());
        }
    }
}
