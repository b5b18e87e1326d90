import uuid

from kio.static.primitive import i8, i16, i32, i64

from codec.records import encode_batch
from codec.share_state import (
    DeliveryState,
    RecordType,
    ShareSnapshotKey,
    ShareSnapshotValue,
    ShareUpdateKey,
    ShareUpdateValue,
    decode_record,
    encode_record,
)
from integration.bench.state_bench import (
    EVICTED,
    UPSTREAM_READ,
    changed_ranges,
    deltas_on,
    delta_scheme,
    gc_pauses,
    log_bytes,
    partition_dirs,
    proxy_counters,
    read_state_log,
    released_once,
)

A, B = ("accepted",), ("available",)  # attributes, opaque to changed_ranges


def test_released_once_is_deterministic_and_near_the_fraction():
    picked = [released_once(p, o, 0.1, 14) for p in range(4) for o in range(5000)]
    assert picked == [released_once(p, o, 0.1, 14) for p in range(4) for o in range(5000)]
    assert 0.09 < sum(picked) / len(picked) < 0.11
    assert picked != [released_once(p, o, 0.1, 15) for p in range(4) for o in range(5000)]
    assert not any(released_once(0, o, 0.0, 14) for o in range(1000))


def test_changed_ranges_keeps_only_what_differs():
    assert changed_ranges([], [(0, 9, A)]) == [(0, 9, A)]
    assert changed_ranges([(0, 9, A)], [(0, 9, A)]) == []
    # a range that grew: only the new part
    assert changed_ranges([(0, 4, A)], [(0, 9, A)]) == [(5, 9, A)]
    # one offset changed state inside a range
    assert changed_ranges([(0, 9, A)], [(0, 3, A), (4, 4, B), (5, 9, A)]) == [(4, 4, B)]
    # same offsets, another state
    assert changed_ranges([(0, 9, B)], [(0, 9, A)]) == [(0, 9, A)]
    # a hole in the old state inside a new range
    assert changed_ranges([(0, 2, A), (6, 9, A)], [(0, 9, A)]) == [(3, 5, A)]
    # old ranges before the new ones (below a moved SPSO) do not matter
    assert changed_ranges([(0, 9, A), (10, 19, B)], [(10, 19, B), (20, 29, A)]) == [(20, 29, A)]


def _key(partition=0):
    return ShareSnapshotKey(group_id="g", topic_id=uuid.UUID(int=7), partition=i32(partition))


def _snapshot(start, batches, epoch=1):
    return ShareSnapshotValue(
        snapshot_epoch=i32(epoch), state_epoch=i32(0), leader_epoch=i32(0), start_offset=i64(start),
        create_timestamp=i64(1), write_timestamp=i64(2),
        state_batches=tuple(ShareSnapshotValue.StateBatch(first_offset=i64(f), last_offset=i64(la),
                                                          delivery_state=i8(s), delivery_count=i16(c))
                            for f, la, s, c in batches))


def _encoded(partition, start, batches):
    return encode_record(_key(partition), _snapshot(start, batches))


def test_delta_scheme_writes_the_first_snapshot_then_updates_of_what_changed():
    ack, avail = DeliveryState.ACKNOWLEDGED, DeliveryState.AVAILABLE
    snapshots = [
        _encoded(0, 0, []),  # initialised
        _encoded(0, 0, [(0, 4, ack, 1), (5, 5, avail, 1), (6, 9, ack, 1)]),
        _encoded(0, 5, [(5, 5, ack, 2), (6, 9, ack, 1)]),  # SPSO moved, one offset accepted on redelivery
        _encoded(1, 0, []),
    ]
    estimate = delta_scheme(snapshots, snapshot_every=500)
    assert (estimate.snapshots, estimate.changes, estimate.updates, estimate.update_ranges) == (2, 2, 2, 4)
    assert estimate.snapshot_bytes == sum(len(k) + len(v) for k, v in (snapshots[0], snapshots[3]))
    # the second update carries the SPSO and offset 5 only
    key_bytes, value_bytes = encode_record(
        ShareUpdateKey(group_id="g", topic_id=uuid.UUID(int=7), partition=i32(0)),
        ShareUpdateValue(snapshot_epoch=i32(1), leader_epoch=i32(0), start_offset=i64(5),
                         state_batches=(ShareUpdateValue.StateBatch(first_offset=i64(5), last_offset=i64(5),
                                                                    delivery_state=i8(ack), delivery_count=i16(2)),)))
    assert decode_record(key_bytes, value_bytes).record_type is RecordType.SHARE_UPDATE
    first_update = delta_scheme(snapshots[:2]).update_bytes
    assert estimate.update_bytes - first_update == len(key_bytes) + len(value_bytes)


def test_delta_scheme_writes_a_full_snapshot_every_n_changes():
    snapshots = [_encoded(0, 0, [(0, n, DeliveryState.ACKNOWLEDGED, 1)]) for n in range(7)]
    estimate = delta_scheme(snapshots, snapshot_every=3)
    # first as a snapshot, then changes 1..6: the 3rd and 6th written whole
    assert (estimate.changes, estimate.updates, estimate.snapshots) == (6, 4, 3)


def test_read_state_log_counts_records_by_type_from_an_offset(tmp_path):
    directory = tmp_path / "__state-0"
    directory.mkdir()
    (tmp_path / "__state-1-delete").mkdir()  # a deleted partition's directory is not the topic's
    (tmp_path / "__state-extra-2").mkdir()
    first = _encoded(0, 0, [])
    second = _encoded(0, 0, [(0, 9, DeliveryState.ACKNOWLEDGED, 1)])
    update = encode_record(ShareUpdateKey(group_id="g", topic_id=None, partition=i32(0)),
                           ShareUpdateValue(snapshot_epoch=i32(1), leader_epoch=i32(0), start_offset=i64(-1)))
    segment = (encode_batch(0, [first[1]], keys=[first[0]])
               + encode_batch(1, [second[1], update[1]], keys=[second[0], update[0]]))
    (directory / "00000000000000000000.log").write_bytes(segment)
    dirs = partition_dirs(tmp_path, "__state")
    assert dirs == {0: directory}

    whole = read_state_log(dirs, keep_snapshots=True)
    assert (whole.disk_bytes, whole.batch_bytes, whole.batches, whole.records) == (len(segment), len(segment), 2, 3)
    assert whole.end_offsets == {0: 3} and whole.max_segments == 1
    assert whole.by_type["SHARE_SNAPSHOT"].records == 2 and whole.by_type["SHARE_UPDATE"].records == 1
    assert whole.snapshots == [first, second]

    since = read_state_log(dirs, {0: 2})
    assert (since.records, since.batches, list(since.by_type)) == (1, 1, ["SHARE_UPDATE"])
    assert since.by_type["SHARE_UPDATE"].value_bytes == len(update[1])


def test_deltas_on_reads_the_serve_flags_of_a_proxy_variant():
    assert deltas_on(("--state-deltas", "on"))
    assert deltas_on(("--log-level", "warning", "--state-deltas", "ON"))
    assert not deltas_on(("--state-deltas", "off"))
    assert not deltas_on(())


def test_gc_pauses_are_read_from_a_real_metrics_endpoint():
    import gc

    from prometheus_client import start_http_server

    from proxy.collector import time_pauses
    from proxy.localkafka.broker import free_port

    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1")
    timer = time_pauses()
    try:
        gc.collect(2)
        summary = gc_pauses(port)
    finally:
        gc.callbacks.remove(timer)
        server.shutdown()
        server.server_close()
        thread.join(5)
    assert "generation 2: " in summary and " collections, " in summary and "25 ms or more" in summary
    assert int(summary.split("generation 2: ")[1].split(" collections")[0]) >= 1


def test_gc_pauses_of_a_proxy_without_the_metric_say_so(monkeypatch):
    import io
    import urllib.request

    monkeypatch.setattr(urllib.request, "urlopen", lambda *a, **k: io.BytesIO(b"# nothing here\n"))
    assert gc_pauses(1) == "not measured (no ksp_gc_pause_seconds)"


def test_the_proxys_upstream_read_bytes_are_read_from_a_real_metrics_endpoint():
    from prometheus_client import start_http_server

    from proxy.localkafka.broker import free_port
    from proxy.share import metrics

    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1")
    try:
        before, evicted_before = proxy_counters(port, UPSTREAM_READ, EVICTED)
        metrics.UPSTREAM_FETCH_BYTES.inc(1234)
        metrics.READ_CACHE_EVICTED_BYTES.inc(56)
        after, evicted_after = proxy_counters(port, UPSTREAM_READ, EVICTED)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    assert before is not None and after - before == 1234
    assert evicted_before is not None and evicted_after - evicted_before == 56


def test_upstream_read_bytes_of_a_proxy_without_the_metric_are_none(monkeypatch):
    import io
    import urllib.request

    monkeypatch.setattr(urllib.request, "urlopen", lambda *a, **k: io.BytesIO(b"# nothing here\n"))
    assert proxy_counters(1, UPSTREAM_READ) == (None,)


def test_log_bytes_counts_the_segment_files_only(tmp_path):
    first, second = tmp_path / "t-0", tmp_path / "t-1"
    for directory, size in ((first, 100), (second, 50)):
        directory.mkdir()
        (directory / "00000000000000000000.log").write_bytes(bytes(size))
        (directory / "00000000000000000000.index").write_bytes(bytes(999))
    (second / "00000000000000000060.log").write_bytes(bytes(7))
    assert log_bytes([first, second]) == 157
