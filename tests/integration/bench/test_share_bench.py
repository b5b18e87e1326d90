"""share_bench's pure parts: shapes, proxy trees, and the tables built from measurements."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from codec.records import encode_batch
from integration.bench.share_bench import (
    ClientFetches,
    batch_record_counts,
    describe_batches,
    CpuSampler,
    CpuUse,
    Measurement,
    best,
    streaming_cpu,
    cpu_table,
    fetches_table,
    fetch_waits,
    latency_breakdown,
    parse_client_fetches,
    main,
    parse_trees,
    profile_summary,
    proxy_sides,
    repeats_table,
    report_progress,
    rotated,
    settle_machine,
    side_order,
    table,
    trees_table,
    upstream_reads,
    warm_up,
)


def measurement(label: str, path: str, consumers: int, partitions: int, seconds: float) -> Measurement:
    kind = "share group" if label.startswith("share") else "consumer group"
    return Measurement(label, path, kind, consumers, 100_000, 100.0, seconds, 0.0, partitions=partitions)


def test_parse_trees_resolves_paths_and_refuses_what_is_not_name_equals_path(tmp_path):
    assert parse_trees(f"before={tmp_path},after=.") == [("before", str(tmp_path)), ("after", str(Path.cwd()))]
    with pytest.raises(argparse.ArgumentTypeError):
        parse_trees("before")
    with pytest.raises(argparse.ArgumentTypeError):
        parse_trees("=/tmp")


def test_proxy_sides_add_a_current_tree_proxy_per_variant():
    # Alone: the current tree's proxy, unnamed (its results read "proxy", as goals.py expects).
    assert proxy_sides(None, []) == [("", "", ())]
    # Variants alone are measured against the current tree's defaults, named so.
    assert proxy_sides(None, [("glibc", ("--malloc-arenas", "0"))]) == [
        ("default", "", ()), ("glibc", "", ("--malloc-arenas", "0"))]
    assert proxy_sides([("before", "/tmp/b"), ("after", "/tmp/a")], [("x", ("--gc-threshold", "0"))]) == [
        ("before", "/tmp/b", ()), ("after", "/tmp/a", ()), ("x", "", ("--gc-threshold", "0"))]
    with pytest.raises(ValueError, match="must differ"):
        proxy_sides([("after", "/tmp/a")], [("after", ("--gc-threshold", "0"))])


def test_a_variant_named_like_a_tree_is_refused_before_any_broker_starts(capsys):
    with pytest.raises(SystemExit) as refused:
        main(["--proxy-trees", "after=.", "--variant", "after=--gc-threshold 0"])
    assert refused.value.code == 2
    assert "proxy names must differ" in capsys.readouterr().err


def test_every_cell_runs_each_side_first_once_in_as_many_repeats_as_sides():
    sides = ["base", "trial", "native"]
    for cell in range(6):
        firsts = [side_order(sides, cell, repeat)[0] for repeat in range(len(sides))]
        assert sorted(firsts) == sorted(sides)
    # Neighbouring cells of one repeat start differently too.
    assert side_order(["a", "b"], 0, 0)[0] != side_order(["a", "b"], 1, 0)[0]


def test_rotated_alternates_which_side_goes_first():
    assert [rotated(["a", "b"], n) for n in range(3)] == [["a", "b"], ["b", "a"], ["a", "b"]]
    assert rotated([], 3) == []


def test_best_and_tables_keep_the_partition_shapes_apart():
    results = [
        measurement("consumer group, direct", "direct", 1, 4, 1.0),
        measurement("consumer group, direct", "direct", 1, 32, 2.0),
        measurement("share group x4, native", "native", 4, 4, 2.0),
        measurement("share group x4, native", "native", 4, 32, 4.0),
        measurement("share group x4, proxy before", "proxy", 4, 4, 2.0),
        measurement("share group x4, proxy after", "proxy", 4, 4, 1.0),
        measurement("share group x4, proxy after", "proxy", 4, 4, 1.6),  # a slower repeat
        measurement("share group x4, proxy before", "proxy", 4, 32, 4.0),
        measurement("share group x4, proxy after", "proxy", 4, 32, 5.0),
    ]
    assert best(results, "share group x4, native", 32).seconds == 4.0
    assert best(results, "share group x4, proxy after", 4).seconds == 1.0
    assert best(results, "share group x4, proxy after", 8) is None

    four = table(results, [4], 4, ["before", "after"])
    assert "| share group x4, proxy after | 4 | 100,000 |" in four
    assert "| 2.00 / 2.00 |" in four  # after / native at 4 partitions
    thirty_two = table(results, [4], 32, ["before", "after"])
    assert "| share group x4, proxy after | 4 | 20,000 |" in thirty_two
    assert "| 0.80 / 0.80 |" in thirty_two

    assert trees_table(results, [4], 4, ["before", "after"]).splitlines()[-1] == "| 4 | 2.00 / 2.00 |"
    assert trees_table(results, [4], 32, ["before", "after"]).splitlines()[-1] == "| 4 | 0.80 / 0.80 |"

    repeats = repeats_table(results, 4).splitlines()
    assert repeats[0] == "| measurement | repeat 1 | repeat 2 |"
    assert "| share group x4, proxy after | 100,000 · 100,000 · 0.0 | 62,500 · 62,500 · 0.0 |" in repeats
    assert "| share group x4, native | 50,000 · 50,000 · 0.0 |  |" in repeats


def test_native_through_the_hop_is_a_side_of_its_own_set_against_native():
    native = Measurement("share group x4, native", "native", "share group", 4, 1_000_000, 1.0, 6.0, 1.0,
                         partitions=4, client=ClientFetches(1000, 2.0, 1000.0), cpu=CpuUse(5.0, 8.0, 3.0, 4.0, 0.0, 2))
    via_hop = Measurement("share group x4, native via hop", "native-hop", "share group", 4, 1_000_000, 1.0, 7.0,
                          2.0, partitions=4, client=ClientFetches(1000, 2.5, 1000.0),
                          cpu=CpuUse(5.0, 9.0, 3.0, 4.0, 0.5, 2))
    proxy = Measurement("share group x4, proxy", "proxy", "share group", 4, 1_000_000, 1.0, 8.0, 3.0,
                        partitions=4, client=ClientFetches(1000, 3.0, 1000.0), cpu=CpuUse(5.0, 10.0, 2.0, 4.0, 3.0, 2))
    results = [proxy, via_hop, native]
    rows = table(results, [4], 4).splitlines()
    # Native, then the hop against native (streaming 200,000 against 200,000: 1.00), then the proxy.
    assert [row.split(" | ")[0] for row in rows[2:]] == [
        "| share group x4, native", "| share group x4, native via hop", "| share group x4, proxy"]
    assert rows[3].endswith("| 0.86 / 1.00 |  |")
    assert rows[4].endswith("| 0.75 / 1.00 |  |")
    fetches = fetches_table(results, [4], 4).splitlines()
    assert fetches[3] == "| share group x4, native via hop | 1,000 | 1,000 | 2.50 | 20.00 | 17.50 | +0.50 | -0.50 |"
    cpu = cpu_table(results, [4], 4).splitlines()
    assert cpu[3] == "| share group x4, native via hop | 200,000 | 4.00 | 3.00 | 0.50 | 9.00 | 1.12 | 90% |"
    assert len(cpu) == 5


@pytest.mark.parametrize("other", [["--no-native"], ["--separate-brokers"], ["--share-authorization", "off,cluster"]])
def test_the_hop_is_refused_where_native_does_not_run_beside_the_proxy(capsys, other):
    with pytest.raises(SystemExit) as refused:
        main(["--hop", *other])
    assert refused.value.code == 2
    assert "--hop measures native share groups" in capsys.readouterr().err


def test_the_warm_up_runs_every_side_once_on_the_first_shape(capsys):
    ran = []
    warm_up(["proxy", "native", "native via hop"], {4: "topic-p4", 32: "topic-p32"}, [1, 4, 16],
            lambda side, topic, partitions, consumers: ran.append((side, topic, partitions, consumers)))
    assert ran == [("proxy", "topic-p4", 4, 1), ("native", "topic-p4", 4, 1), ("native via hop", "topic-p4", 4, 1)]
    assert "not measured" in capsys.readouterr().err


def test_profile_summary_counts_self_and_inclusive_samples(tmp_path):
    raw = tmp_path / "profile.txt"
    raw.write_text("main (a.py:1);read (r.py:10);parse (p.py:3) 6\n"
                   "main (a.py:1);read (r.py:12) 2\n"
                   "main (a.py:1);encode (e.py:7) 2\n"
                   "Thread._bootstrap (threading.py:1);_poll_loop (persister.py:9) 40\n")
    lines = profile_summary(raw, top=2).splitlines()
    assert lines[0].startswith("10 main-thread samples (40 in other threads)")
    assert lines[1].split() == ["60.0", "60.0", "parse", "(p.py)"]
    assert lines[2].split() == ["20.0", "80.0", "read", "(r.py)"]  # line numbers merged: one function
    by_inclusive = lines[lines.index("by inclusive:") + 1:]
    assert by_inclusive[0].split() == ["0.0", "100.0", "main", "(a.py)"]
    assert by_inclusive[1].split() == ["20.0", "80.0", "read", "(r.py)"]


def test_latency_breakdown_takes_the_runs_share_of_the_histograms():
    fetch = (("api", "ShareFetch"),)
    before = {("ksp_request_seconds_count", fetch): 10.0, ("ksp_request_seconds_sum", fetch): 1.0}
    after = {("ksp_request_seconds_count", fetch): 410.0, ("ksp_request_seconds_sum", fetch): 3.0,
             ("ksp_share_state_write_seconds_count", ()): 100.0, ("ksp_share_state_write_seconds_sum", ()): 0.4}
    assert latency_breakdown(before, after, 200_000) == (
        "ShareFetch 400 x 5.00 ms, state write 100 x 4.00 ms, 500 records per ShareFetch")


def test_latency_breakdown_names_the_bucket_of_the_median_beside_the_mean():
    fetch = (("api", "ShareFetch"),)

    def buckets(counts):
        return {("ksp_request_seconds_bucket", tuple(sorted((*fetch, ("le", le))))): n for le, n in counts.items()}

    before = {("ksp_request_seconds_count", fetch): 0.0, ("ksp_request_seconds_sum", fetch): 0.0,
              **buckets({"0.005": 0.0, "0.01": 0.0, "0.5": 0.0, "+Inf": 0.0})}
    # 96 fetches of 5-10 ms, 4 empty long polls of ~500 ms at the end: the mean says 24.8 ms.
    after = {("ksp_request_seconds_count", fetch): 100.0, ("ksp_request_seconds_sum", fetch): 2.48,
             **buckets({"0.005": 0.0, "0.01": 96.0, "0.5": 96.0, "+Inf": 100.0})}
    assert latency_breakdown(before, after, 100_000) == (
        "ShareFetch 100 x 24.80 ms (median 5-10 ms), 1,000 records per ShareFetch")


_METRICS = """\
consumer-share-fetch-manager-metrics:fetch-latency-avg:{client-id=perf-share-consumer-client-1}   : 12.000
consumer-share-fetch-manager-metrics:fetch-total:{client-id=perf-share-consumer-client-1}         : 30.000
consumer-share-fetch-manager-metrics:records-per-request-avg:{client-id=perf-share-consumer-client-1} : 900.000
consumer-share-fetch-manager-metrics:fetch-latency-avg:{client-id=perf-share-consumer-client-2}   : 4.000
consumer-share-fetch-manager-metrics:fetch-total:{client-id=perf-share-consumer-client-2}         : 10.000
consumer-share-fetch-manager-metrics:records-per-request-avg:{client-id=perf-share-consumer-client-2} : 500.000
consumer-share-fetch-manager-metrics:fetch-latency-avg:{client-id=perf-share-consumer-client-3}   : NaN
consumer-share-fetch-manager-metrics:fetch-total:{client-id=perf-share-consumer-client-3}         : 0.000
consumer-share-metrics:time-between-poll-avg:{client-id=perf-share-consumer-client-1}             : 5.243
"""


def test_client_fetches_weigh_each_consumer_by_its_fetches_and_skip_those_without():
    client = parse_client_fetches("2026-11-27 11:15:59:698, ...\n" + _METRICS)
    assert client == ClientFetches(fetches=40, round_trip_ms=(12 * 30 + 4 * 10) / 40,
                                   records_per_fetch=(900 * 30 + 500 * 10) / 40)
    assert parse_client_fetches("no metrics printed") is None
    # 2 consumers, 20 fetches each over the 4 s after the first record: a 200 ms cycle.
    m = Measurement("share group x2, proxy", "proxy", "share group", 2, 1000, 1.0, 5.0, 1.0, client=client)
    assert client.cycle_ms(m) == 200.0


def test_fetches_table_splits_each_cycle_into_round_trip_and_the_consumers_own_time():
    native = Measurement("share group x1, native", "native", "share group", 1, 1000, 1.0, 6.0, 5.0,
                         partitions=4, client=ClientFetches(100, 3.5, 10.0))  # 10 ms cycle
    proxy = Measurement("share group x1, proxy", "proxy", "share group", 1, 1000, 1.0, 1.5, 0.3,
                        partitions=4, client=ClientFetches(100, 4.0, 10.0))  # 12 ms cycle
    rows = fetches_table([native, proxy], [1], 4).splitlines()
    assert rows[2] == "| share group x1, native | 100 | 10 | 3.50 | 10.00 | 6.50 |  |  |"
    assert rows[3] == "| share group x1, proxy | 100 | 10 | 4.00 | 12.00 | 8.00 | +0.50 | +1.50 |"
    # A run without the consumers' metrics (an older tool) leaves its row out rather than failing.
    assert len(fetches_table([native, dataclasses.replace(proxy, client=None)], [1], 4).splitlines()) == 3


def test_a_measurement_round_trips_through_its_json_numbers():
    m = Measurement("share group x1, proxy", "proxy", "share group", 1, 1000, 1.0, 1.5, 0.3,
                    partitions=4, client=ClientFetches(100, 4.0, 10.0), cpu=CpuUse(2.0, 3.0, 1.0, 1.5, 0.5, 2))
    numbers = {**dataclasses.asdict(m), "records_per_second": m.records_per_second}
    assert Measurement.from_json(numbers) == m
    assert Measurement.from_json({**numbers, "client": None}).client is None


def test_a_cpu_window_is_read_off_the_samples_between_two_instants():
    sampler = CpuSampler(None, None)
    # wall, machine, broker, proxy, consumers: cumulative seconds
    sampler.samples = [(100.0, 10.0, 1.0, 2.0, 0.0), (101.0, 11.5, 1.5, 2.5, 0.5), (103.0, 14.5, 2.5, 3.0, 1.5)]
    use = sampler.window(100.5, 102.0)
    assert use is not None
    assert (use.window_s, use.machine_s, use.broker_s, use.proxy_s, use.consumers_s) == (1.5, 2.25, 0.75, 0.5, 0.75)
    assert sampler.window(99.0, 102.0) is None and sampler.window(100.5, 104.0) is None  # not covered
    m = Measurement("share group x1, proxy", "proxy", "share group", 1, 1000, 1.0, 2.0, 0.5, started_at=100.0)
    assert streaming_cpu(sampler, m) == use  # from the first record (100.5) to the last (102.0)
    assert streaming_cpu(sampler, dataclasses.replace(m, started_at=None)) is None


def test_the_sampler_follows_the_machine_and_a_process_given_by_pid():
    import os
    import subprocess
    import sys
    import time

    if not Path("/proc/stat").exists():
        pytest.skip("no /proc on this system: CPU is not sampled")
    burn = "import time\nend = time.process_time() + 0.4\nwhile time.process_time() < end: pass"
    with CpuSampler(None, None, interval_s=0.02) as sampler:
        child = subprocess.Popen([sys.executable, "-c", burn])
        sampler.consumers_started(child.pid)
        started = time.time()
        time.sleep(0.6)  # the child burns its 0.4 s meanwhile (and is still there to be read)
        ended = time.time()
        time.sleep(0.05)
    child.wait()
    use = sampler.window(started, ended)
    assert use is not None
    assert 0.2 <= use.consumers_s <= 0.5
    assert use.machine_s >= use.consumers_s * 0.8  # the machine saw it too (clock-tick granularity)
    assert use.proxy_s == 0.0 and use.broker_s == 0.0 and use.cores == os.cpu_count()


def test_cpu_table_puts_each_sides_cost_per_million_records_side_by_side():
    native = Measurement("share group x1, native", "native", "share group", 1, 1_000_000, 1.0, 6.0, 5.0,
                         partitions=4, cpu=CpuUse(8.0, 8.0, 3.0, 4.0, 0.0, 2))
    proxy = Measurement("share group x1, proxy", "proxy", "share group", 1, 1_000_000, 1.0, 5.0, 1.0,
                        partitions=4, cpu=CpuUse(6.0, 10.0, 2.5, 4.5, 2.0, 2))
    rows = cpu_table([native, proxy], [1], 4).splitlines()
    assert rows[2] == "| share group x1, native | 1,000,000 | 4.00 | 3.00 | 0.00 | 8.00 |  | 50% |"
    assert rows[3] == "| share group x1, proxy | 250,000 | 4.50 | 2.50 | 2.00 | 10.00 | 1.25 | 83% |"
    assert len(cpu_table([native, dataclasses.replace(proxy, cpu=None)], [1], 4).splitlines()) == 3


def test_upstream_reads_are_counted_per_sharefetch_against_the_bytes_consumed():
    fetch = (("api", "ShareFetch"),)
    before = {("ksp_share_upstream_fetches_total", (("kind", "read"),)): 10.0,
              ("ksp_request_seconds_count", fetch): 100.0}
    after = {("ksp_share_upstream_fetches_total", (("kind", "read"),)): 60.0,
             ("ksp_share_upstream_fetches_total", (("kind", "long_poll"),)): 10.0,
             ("ksp_share_upstream_fetch_partitions_total", ()): 240.0,
             ("ksp_share_upstream_fetch_bytes_total", ()): 110.0 * (1 << 20),
             ("ksp_request_seconds_count", fetch): 200.0}
    assert upstream_reads(before, after, 100.0) == (
        "upstream Fetches 50 (0.50 per ShareFetch) and 10 long polls, 4.0 partitions each; "
        "110 MiB read for 100 MiB consumed (1.10)")
    assert upstream_reads(before, before, 100.0) == ""


def test_fetch_waits_counts_the_runs_wakeups_and_early_answers():
    records, nothing = (("outcome", "records"),), (("outcome", "nothing"),)
    before = {("ksp_share_fetch_wakeups_total", records): 5.0, ("ksp_share_fetch_wakeups_total", nothing): 7.0,
              ("ksp_share_fetch_self_pinned_total", ()): 1.0}
    after = {("ksp_share_fetch_wakeups_total", records): 105.0, ("ksp_share_fetch_wakeups_total", nothing): 1_207.0,
             ("ksp_share_fetch_self_pinned_total", ()): 31.0}
    assert fetch_waits(before, after) == (
        "waiting fetches woken 1,300 times (1,200 to nothing), 30 answered early (self-pinned)")
    assert fetch_waits(before, before) == ""
    # A proxy tree from before the wake-up counter: its wake-ups are unknown, not zero.
    older = {("ksp_share_fetch_self_pinned_total", ()): 31.0}
    assert fetch_waits({}, older) == "31 answered early (self-pinned)"


class FakeMachine:
    """/proc/stat's (busy, total) jiffies per sample, a clock that sleeping advances, sync counted."""

    def __init__(self, busy_per_sample: list[int], total_per_sample: int = 200) -> None:
        self.busy, self.total, self.now, self.synced = 0, 0, 0.0, 0
        self.busy_per_sample, self.total_per_sample = list(busy_per_sample), total_per_sample

    def ticks(self) -> tuple[int, int]:
        return self.busy, self.total

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.busy += self.busy_per_sample.pop(0) if self.busy_per_sample else self.total_per_sample
        self.total += self.total_per_sample

    def settle(self, **kwargs) -> float:
        return settle_machine(ticks=self.ticks, sleep=self.sleep, clock=lambda: self.now,
                              sync=lambda: setattr(self, "synced", self.synced + 1), **kwargs)


def test_settling_the_machine_syncs_then_waits_for_a_second_of_idle_cores():
    machine = FakeMachine([180, 90, 30, 10])  # of 200 jiffies: 90 %, 45 %, 15 %, then 5 % busy
    assert machine.settle() == 4.0
    assert machine.synced == 1


def test_settling_the_machine_gives_up_after_its_limit():
    machine = FakeMachine([])  # busy for ever
    assert machine.settle(max_wait_s=5.0) == 5.0
    assert machine.synced == 1


def test_report_progress_gives_the_proxys_resident_memory_when_it_was_read(capsys):
    run = measurement("share group x1, proxy", "proxy", 1, 4, 10.0)
    report_progress(dataclasses.replace(run, proxy_rss_kib=100 * 1024, proxy_peak_rss_kib=150 * 1024))
    assert "; proxy resident 100 MiB after the run, 150 MiB at most so far" in capsys.readouterr().err
    report_progress(run)  # native runs, and a proxy whose /proc could not be read
    assert "resident" not in capsys.readouterr().err


def test_batch_record_counts_reads_every_partition_of_the_topic_and_no_other(tmp_path):
    for directory, batches in {"bench-7": [3, 2], "bench-12": [5], "bench-x-0": [9], "bench-7x": [9]}.items():
        (tmp_path / directory).mkdir()
        offset, data = 0, b""
        for count in batches:
            data += encode_batch(offset, [b"v"] * count)
            offset += count
        (tmp_path / directory / "00000000000000000000.log").write_bytes(data)
    (tmp_path / "bench-7" / "00000000000000000000.index").write_bytes(b"\0" * 8)

    assert batch_record_counts(tmp_path, "bench") == {7: [3, 2], 12: [5]}


def test_describe_batches_gives_the_median_and_the_deciles():
    counts = [960] * 90 + [40] * 10

    assert describe_batches(counts) == (
        "100 batches, records per batch: median 960, deciles 10-90 % 960, 960, 960, 960, 960, 960, 960, 960, 960")
    assert describe_batches([1, 2, 3, 4, 5, 6, 7, 8, 9, 10]).startswith(
        "10 batches, records per batch: median 6, deciles 10-90 % 2, 3, 4, 5, 6, 7, 8, 9, 10")
    assert describe_batches([]) == "no batches found"
