"""The garbage-collector settings applied at start-up (proxy.collector)."""

from __future__ import annotations

import gc
import weakref

import pytest

from proxy import metrics
from proxy.collector import OLDER_THRESHOLDS, freeze_startup_objects, refreeze, time_pauses, tune_collector


@pytest.fixture
def restored_collector():
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def test_the_young_threshold_moves_and_the_older_ones_stay_cpythons(restored_collector):
    assert tune_collector(10_000) is True
    assert gc.get_threshold() == (10_000, *OLDER_THRESHOLDS)


def test_zero_leaves_the_collector_alone(restored_collector):
    gc.set_threshold(700, 10, 10)
    assert tune_collector(0) is False
    assert gc.get_threshold() == (700, 10, 10)


def test_objects_alive_at_start_up_are_frozen_and_later_garbage_is_still_collected(restored_collector):
    # (Not compared with gc.get_freeze_count() afterwards: in a clean-clone CI run of the whole
    # suite that count moved by 66 between two calls, with other tests' threads alive; what this
    # test needs is that objects were frozen and that later garbage is still collected.)
    assert freeze_startup_objects() > 1000  # this test process alone holds that many tracked objects

    class Node:
        pass

    # A reference cycle made after the freeze is an ordinary object: a collection frees it.
    a, b = Node(), Node()
    a.other, b.other = b, a
    alive = {id(a), id(b)}
    del a, b
    gc.collect()
    assert not alive & {id(o) for o in gc.get_objects() if isinstance(o, Node)}


def test_freezing_again_collects_frozen_garbage_and_freezes_what_is_alive(restored_collector):
    class Node:
        pass

    def cycle() -> weakref.ref:
        node = Node()
        node.self = node
        return weakref.ref(node)

    gc.disable()  # no collection between the cycle's last use and the freeze
    try:
        dropped = cycle()  # garbage already, but frozen before any collection sees it
        gc.freeze()
    finally:
        gc.enable()
    gc.collect()
    assert dropped() is not None  # a frozen cycle outlives its last use...
    kept = Node()
    assert refreeze() > 1000
    assert dropped() is None  # ...until frozen again
    assert not any(o is kept for o in gc.get_objects())  # what is alive is frozen


def test_nothing_is_frozen_again_when_nothing_was(restored_collector):
    gc.unfreeze()
    assert refreeze() == 0
    assert gc.get_freeze_count() == 0


def test_every_collection_is_timed_per_generation(restored_collector):
    timer = time_pauses()
    assert time_pauses() is timer  # installed once
    try:
        before = [metrics.GC_PAUSE_SECONDS.labels(generation=str(g))._sum.get() for g in range(3)]
        counts = [_count(g) for g in range(3)]
        gc.collect(2)
        gc.collect(0)
        assert _count(2) == counts[2] + 1 and _count(0) == counts[0] + 1
        assert metrics.GC_PAUSE_SECONDS.labels(generation="2")._sum.get() > before[2]
    finally:
        gc.callbacks.remove(timer)


def _count(generation: int) -> float:
    samples = metrics.GC_PAUSE_SECONDS.collect()[0].samples
    return next(s.value for s in samples
                if s.name.endswith("_count") and s.labels["generation"] == str(generation))
