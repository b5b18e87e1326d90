"""gain_stall's reading of the proxy's collector pauses from a /metrics text, and of memory growth."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from integration.bench.gain_stall import full_collections_between, gc_pauses, growth_per_hand_over, main


def test_collections_and_pause_seconds_per_generation_are_read_from_the_exposition():
    registry = CollectorRegistry()
    pauses = Histogram("ksp_gc_pause_seconds", "pauses", ["generation"], registry=registry)
    for generation, seconds in (("0", 0.001), ("0", 0.002), ("2", 0.15)):
        pauses.labels(generation=generation).observe(seconds)
    text = generate_latest(registry).decode()
    assert gc_pauses(text) == {0: (2, 0.003), 2: (1, 0.15)}
    assert gc_pauses("ksp_other_total 1.0\n") == {}


def test_the_full_collections_between_two_texts_are_their_difference():
    registry = CollectorRegistry()
    pauses = Histogram("ksp_gc_pause_seconds", "pauses", ["generation"], registry=registry)
    pauses.labels(generation="2").observe(0.1)
    pauses.labels(generation="0").observe(0.001)
    first = generate_latest(registry).decode()
    pauses.labels(generation="2").observe(0.25)
    pauses.labels(generation="0").observe(0.002)
    collections, seconds = full_collections_between(first, generate_latest(registry).decode())
    assert collections == 1 and abs(seconds - 0.25) < 1e-9
    assert full_collections_between(first, first) == (0, 0.0)


def test_growth_per_hand_over_leaves_the_first_out_and_fits_the_rest():
    assert growth_per_hand_over([100_000, 150_000, 151_000, 152_000, 153_000]) == pytest.approx(1_000)
    assert growth_per_hand_over([100_000, 150_000, 150_000, 150_000]) == pytest.approx(0)
    assert growth_per_hand_over([100_000, 150_000]) == 0.0  # one settled point: no slope


@pytest.mark.parametrize("hand_overs", ["0", "-1"])
def test_fewer_than_one_hand_over_is_refused_before_any_broker_starts(hand_overs, capsys):
    with pytest.raises(SystemExit) as refused:
        main(["--hand-overs", hand_overs])
    assert refused.value.code == 2
    assert "--hand-overs must be 1 or more" in capsys.readouterr().err
