"""A scale-out instance's housekeeping around a change of the state partitions it owns
(proxy.share.runtime.ScaleOut): the collector's frozen set follows the state held."""

from __future__ import annotations

import gc
import weakref
from types import SimpleNamespace

import pytest
import trio
import trio.testing

from proxy.collector import freeze_startup_objects
from proxy.share import runtime
from proxy.share.runtime import ScaleOut


class Engine:
    """Stands for a share-partition's state: a reference cycle, as real object graphs have."""

    def __init__(self) -> None:
        self.cycle = self


class FakeWriter:
    def __init__(self) -> None:
        self.released: list[frozenset[int]] = []

    async def fence(self, topic: str, partitions: frozenset[int]) -> None:
        pass

    async def release(self, topic: str, partitions: frozenset[int]) -> None:
        self.released.append(partitions)


class FakeService:
    """Holds one Engine per state partition gained, drops them when they are given up."""

    def __init__(self) -> None:
        self.engines: dict[int, Engine] = {}

    async def gain(self, partitions: frozenset[int], recovered) -> None:
        self.engines.update({partition: Engine() for partition in partitions})

    async def give_up(self, partitions: frozenset[int], *, flush: bool) -> None:
        for partition in partitions:
            del self.engines[partition]


@pytest.fixture
def scale_out(monkeypatch):
    recovered = SimpleNamespace(records=0, groups={}, partitions={}, misplaced=0)
    monkeypatch.setattr(runtime, "fold_state_topic", lambda *args, **kwargs: recovered)
    monkeypatch.setattr(runtime, "FREEZE_DELAY_S", 0.05)
    settings = SimpleNamespace(instance_id="ksp-0", instance_slot=None, state_topic="__share_group_state")
    return ScaleOut(FakeService(), FakeWriter(), settings, "unused:9092", None, 3, SimpleNamespace(directory=None))


@pytest.fixture
def frozen_at_start_up():
    freeze_startup_objects()
    yield
    gc.unfreeze()


def tracked(obj: object) -> bool:
    """Whether the cyclic collector walks `obj` (frozen objects are in no generation)."""
    return any(o is obj for o in gc.get_objects())


async def settled() -> None:
    """Until the freeze a change scheduled has run."""
    await trio.sleep(runtime.FREEZE_DELAY_S)
    await trio.testing.wait_all_tasks_blocked()


async def test_gained_state_is_frozen_and_state_given_up_is_collected(scale_out, frozen_at_start_up, nursery):
    scale_out.nursery = nursery
    await scale_out._gained(frozenset({0, 1, 2}))
    await settled()
    engines = scale_out.service.engines
    assert not any(tracked(engine) for engine in engines.values()), \
        "the gained engines are still walked by every full collection"

    # Frozen, and each a reference cycle: reference counting alone would keep them forever.
    revoked, lost = weakref.ref(engines[0]), weakref.ref(engines[1])
    await scale_out._revoked(frozenset({0}))
    await settled()
    assert revoked() is None, "an engine handed over stays in memory"
    await scale_out._lost(frozenset({1}))
    await settled()
    assert lost() is None, "an engine lost stays in memory"
    assert not tracked(engines[2])  # what is still held stays frozen
    assert scale_out.writer.released == [frozenset({0}), frozenset({1})]


async def test_the_rebalance_does_not_wait_for_the_freeze_and_changes_together_share_one(
        scale_out, frozen_at_start_up, nursery, monkeypatch):
    freezes = []
    monkeypatch.setattr(runtime, "refreeze", lambda: freezes.append(sorted(scale_out.service.engines)) or 1)
    scale_out.nursery = nursery
    await scale_out._gained(frozenset({0, 1}))
    assert freezes == []  # the callback returned before the collection
    await trio.sleep(runtime.FREEZE_DELAY_S / 2)
    await scale_out._revoked(frozenset({0}))
    await settled()
    assert freezes == [[1]]  # one, after both changes
    await scale_out._lost(frozenset({1}))
    await settled()
    assert freezes == [[1], []]


async def test_nothing_is_frozen_when_start_up_froze_nothing(scale_out, nursery):
    # --gc-threshold 0: CPython's defaults, nothing frozen at start-up or later.
    gc.unfreeze()
    scale_out.nursery = nursery
    await scale_out._gained(frozenset({0}))
    await settled()
    assert gc.get_freeze_count() == 0
    assert tracked(scale_out.service.engines[0])
