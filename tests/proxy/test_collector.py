"""The garbage-collector settings applied at start-up (proxy.collector)."""

from __future__ import annotations

import gc

import pytest

from proxy.collector import OLDER_THRESHOLDS, freeze_startup_objects, tune_collector


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
    frozen = freeze_startup_objects()
    assert frozen > 1000  # this test process alone holds that many tracked objects
    assert gc.get_freeze_count() == frozen

    class Node:
        pass

    # A reference cycle made after the freeze is an ordinary object: a collection frees it.
    a, b = Node(), Node()
    a.other, b.other = b, a
    alive = {id(a), id(b)}
    del a, b
    gc.collect()
    assert not alive & {id(o) for o in gc.get_objects() if isinstance(o, Node)}
