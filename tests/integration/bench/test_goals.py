"""goals' pure parts: each benchmark's numbers turned into goals, met or missed, and how a part runs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from integration.bench import goals
from integration.bench.goals import Goal, passthrough_goals, share_goals, state_goals
from integration.bench.passthrough import Measurement as PassthroughMeasurement
from integration.bench.passthrough import per_round_ratios
from integration.bench.share_bench import Measurement as ShareMeasurement


def share(label: str, consumers: int, partitions: int, seconds: float, first: float) -> dict:
    m = ShareMeasurement(label, label.rsplit(", ", 1)[1], "share group", consumers, 100_000, 100.0, seconds, first,
                         partitions=partitions)
    return {**dataclasses.asdict(m), "records_per_second": m.records_per_second}


def test_a_ratio_goal_is_met_at_its_target_and_a_difference_goal_below_it():
    assert Goal("g", "c", 1.1, 1.1).met and not Goal("g", "c", 1.09, 1.1).met
    assert Goal("g", "c", 2.0, 2.0, higher_is_better=False, unit="ms").met
    assert not Goal("g", "c", 2.5, 2.0, higher_is_better=False, unit="ms").met
    assert "**missed**" in Goal("g", "c", 0.5, 0.95).row() and "+2.50 ms" in Goal(
        "g", "c", 2.5, 2.0, higher_is_better=False, unit="ms").row()


def test_share_goals_compare_the_best_streaming_rates_per_consumer_count_and_shape():
    numbers = [
        share("share group x1, proxy", 1, 4, 2.0, 0.5),   # 100,000 / 1.5 s streaming
        share("share group x1, proxy", 1, 4, 3.0, 0.5),   # slower repeat: not the best
        share("share group x1, native", 1, 4, 7.0, 5.0),  # 100,000 / 2.0 s streaming
        share("share group x1, native", 1, 32, 7.0, 5.0),  # no proxy run for this shape: no goal
    ]
    [goal] = share_goals(numbers, [1], [4, 32])
    assert goal.cell == "1 consumers, 4 partitions"
    assert round(goal.measured, 3) == round(2.0 / 1.5, 3)
    assert goal.met
    assert "hop" not in goal.note  # a run without --hop


def test_a_share_goal_notes_native_through_the_bare_hop_against_native():
    numbers = [share("share group x1, proxy", 1, 4, 2.0, 0.5),
               share("share group x1, native", 1, 4, 7.0, 5.0),   # 100,000 / 2.0 s streaming
               share("share group x1, native via hop", 1, 4, 7.5, 5.0)]  # 100,000 / 2.5 s
    [goal] = share_goals(numbers, [1], [4])
    assert round(goal.measured, 3) == round(2.0 / 1.5, 3)  # the proxy against native, not the hop
    assert goal.note.endswith("; native through a bare TCP hop 0.80x native")


def test_passthrough_goals_take_the_median_of_per_round_ratios():
    rows = []
    for round_number, (direct_s, proxy_s) in enumerate([(1.0, 2.0), (1.0, 1.0), (1.0, 1.25)]):
        rows.append(PassthroughMeasurement("direct", "consume", 8, round_number, 1000, 1000, direct_s))
        rows.append(PassthroughMeasurement("proxy", "consume", 8, round_number, 1000, 1000, proxy_s))
    ratios = per_round_ratios(rows, "proxy")
    assert ratios == {"consume": {8: 0.8}}
    [goal] = passthrough_goals({"per_round_ratio_to_direct": {"proxy": {"consume": {"8": 0.8}}}})
    assert goal.cell == "8 connections" and goal.target == 0.95 and not goal.met
    assert "hop" not in goal.note  # a run without --hop


def test_a_passthrough_goal_notes_the_bare_hops_ratio_from_the_same_rounds():
    [produce, consume] = passthrough_goals({"per_round_ratio_to_direct": {
        "proxy": {"produce": {"1": 0.84}, "consume": {"1": 0.97}},
        "hop": {"produce": {"1": 0.81}, "consume": {"1": 0.99}}}})
    assert produce.note.endswith("a bare TCP hop 0.81") and not produce.met
    assert consume.note.endswith("a bare TCP hop 0.99") and consume.met


def test_state_goals_are_bytes_and_both_latency_quantiles_per_workload():
    side = {"bytes_per_accepted": 0.2, "commit_p50_ms": 5.0, "commit_p99_ms": 20.0, "commits": 100}
    numbers = {"workloads": {"easy": {
        "proxy": side, "native": {**side, "bytes_per_accepted": 0.25},
        "proxy_vs_native": {"bytes": 0.8, "share_partition_bytes": 0.79, "p50_ms": 0.0, "p99_ms": 3.0},
    }}}
    goals = state_goals(numbers)
    assert [(g.goal.split(",")[0], g.met) for g in goals] == [
        ("state bytes per accepted record", True), ("commit_sync latency p50", True), ("commit_sync latency p99", False)]


def test_a_share_goal_notes_both_sides_sharefetch_round_trip_when_the_consumers_reported_it():
    proxy = {**share("share group x1, proxy", 1, 4, 2.0, 0.5), "client": {"fetches": 100, "round_trip_ms": 4.0,
                                                                         "records_per_fetch": 1000.0}}
    native = {**share("share group x1, native", 1, 4, 7.0, 5.0), "client": {"fetches": 100, "round_trip_ms": 3.5,
                                                                           "records_per_fetch": 1000.0}}
    [goal] = share_goals([proxy, native], [1], [4])
    # cycles: 1.5 s / 100 = 15 ms and 2.0 s / 100 = 20 ms; own time = cycle - round trip
    assert "ShareFetch round trip 4.00 vs 3.50 ms, consumer's own time per cycle 11.00 vs 16.50 ms" in goal.note
    [without] = share_goals([share("share group x1, proxy", 1, 4, 2.0, 0.5),
                             share("share group x1, native", 1, 4, 7.0, 5.0)], [1], [4])
    assert "round trip" not in without.note


def test_a_share_goal_notes_both_sides_machine_cpu_per_record_when_it_was_sampled():
    cpu = {"window_s": 2.0, "machine_s": 3.0, "broker_s": 0.5, "consumers_s": 1.5, "proxy_s": 1.0, "cores": 2}
    proxy = {**share("share group x1, proxy", 1, 4, 2.0, 0.5), "cpu": cpu}
    native = {**share("share group x1, native", 1, 4, 7.0, 5.0), "cpu": {**cpu, "machine_s": 2.0, "proxy_s": 0.0}}
    [goal] = share_goals([proxy, native], [1], [4])
    records = proxy["records"]
    per_million = 1e6 / records
    assert (f"machine CPU per million records {3.0 * per_million:.2f} vs {2.0 * per_million:.2f} s "
            f"(proxy {1.0 * per_million:.2f} s), cores busy 75% vs 50%") in goal.note


def test_a_part_runs_after_the_machine_settled_and_its_log_says_for_how_long(tmp_path):
    calls = []

    def main(argv):
        calls.append("main")
        Path(argv[argv.index("--json") + 1]).write_text('{"n": 1}')
        print("the report")
        return 0

    def settle():
        calls.append("settle")
        return 3.2

    log: list[str] = []
    assert goals.run_part("state", tmp_path, main, ["--records", "5"], log, settle=settle) == {"n": 1}
    assert calls == ["settle", "main"]
    assert (tmp_path / "state.txt").read_text() == "the report\n"
    assert "settled for 3 s before it" in log[0]


def with_fetches(row: dict, records_per_fetch: float) -> dict:
    return {**row, "client": {"fetches": 100, "round_trip_ms": 4.0, "records_per_fetch": records_per_fetch}}


def test_a_share_cell_whose_sides_hand_out_unlike_records_per_sharefetch_is_neither_met_nor_missed():
    # Goal run 40: native handed out 399 records per ShareFetch on 32 partitions, the proxy 755, and
    # the proxy's 1.25x counted as met.
    proxy = with_fetches(share("share group x1, proxy", 1, 32, 2.0, 0.5), 755.0)
    native = with_fetches(share("share group x1, native", 1, 32, 7.0, 5.0), 399.0)
    [goal] = share_goals([proxy, native], [1], [32])
    assert goal.measured > 1.1 and not goal.met
    assert goal.unlike == "records per ShareFetch 755 vs 399 (native)"
    assert "| not like for like | records per ShareFetch 755 vs 399 (native); " in goal.row()
    # The other way round too: the proxy handing out half of native's says nothing of its speed.
    [slower] = share_goals([with_fetches(share("share group x1, proxy", 1, 32, 9.0, 0.5), 399.0),
                            with_fetches(share("share group x1, native", 1, 32, 7.0, 5.0), 755.0)], [1], [32])
    assert slower.unlike and "**missed**" not in slower.row()


def test_a_share_cell_within_the_allowed_spread_of_records_per_sharefetch_compares_as_usual():
    # 697 (native, goal run 39) against 801 (the proxy): 1.15x apart, like for like.
    [goal] = share_goals([with_fetches(share("share group x1, proxy", 1, 32, 2.0, 0.5), 801.0),
                          with_fetches(share("share group x1, native", 1, 32, 7.0, 5.0), 697.0)], [1], [32])
    assert goal.unlike == "" and goal.met
    [at_limit] = share_goals([with_fetches(share("share group x1, proxy", 1, 32, 2.0, 0.5), 750.0),
                              with_fetches(share("share group x1, native", 1, 32, 7.0, 5.0), 500.0)], [1], [32])
    assert at_limit.unlike == ""  # exactly 1.5x apart


def test_the_summary_counts_cells_not_like_for_like_apart(tmp_path, monkeypatch):
    monkeypatch.setattr(goals, "run_part", lambda *args, **kwargs: [
        with_fetches(share("share group x1, proxy", 1, 4, 2.0, 0.5), 800.0),
        with_fetches(share("share group x1, native", 1, 4, 7.0, 5.0), 800.0),
        with_fetches(share("share group x1, proxy", 1, 32, 2.0, 0.5), 755.0),
        with_fetches(share("share group x1, native", 1, 32, 7.0, 5.0), 399.0)])
    assert goals.main(["--out", str(tmp_path), "--parts", "share", "--share-consumers", "1",
                       "--share-partitions", "4,32"]) == 0
    assert "1 of 2 met, 1 not like for like." in (tmp_path / "goals.md").read_text()
