"""The ownership group against a real broker (issue 15 step 3, proxy/share/ownership.py).

Two members (as two proxy instances would run them) split a 6-partition state topic between them,
each one's owner map agrees with the group description and with what its callbacks were handed;
when one leaves, the other is handed its partitions within a couple of seconds; a third member
claiming a taken slot is refused. The proxy does not run members yet (wiring is step 4), so the
members run here, in one process, each with its own consumer and thread.
"""

from __future__ import annotations

import time
import uuid

import pytest
import trio

from proxy.share.ownership import InstanceIdentity, OwnershipError, OwnershipMember

pytestmark = pytest.mark.integration

PARTITIONS = 6


class Recorder:
    """What one member's callbacks were handed, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, frozenset[int]]] = []
        self.owned: set[int] = set()

    async def gained(self, partitions: frozenset[int]) -> None:
        self.events.append(("gained", partitions))
        self.owned |= partitions

    async def revoked(self, partitions: frozenset[int]) -> None:
        self.events.append(("revoked", partitions))
        self.owned -= partitions

    async def lost(self, partitions: frozenset[int]) -> None:
        self.events.append(("lost", partitions))
        self.owned -= partitions


def member(bootstrap: str, topic: str, group: str, instance_id: str, slot: int, recorder: Recorder) -> OwnershipMember:
    identity = InstanceIdentity(instance_id, slot, "127.0.0.1", 19000 + 100 * slot, 19100 + 100 * slot)
    return OwnershipMember(bootstrap, topic, identity, group_id=group, on_gained=recorder.gained,
                           on_revoked=recorder.revoked, on_lost=recorder.lost, session_timeout_ms=6000,
                           refresh_s=0.5)


def test_two_instances_split_the_state_partitions_and_one_takes_all_when_the_other_leaves(kafka, create_topic):
    topic = create_topic(f"__state_owners_{uuid.uuid4().hex[:12]}", partitions=PARTITIONS,
                         config={"cleanup.policy": "compact"})
    group = f"ksp-owners.test.{uuid.uuid4().hex[:8]}"
    everything = frozenset(range(PARTITIONS))

    async def scenario() -> dict[str, object]:
        seen: dict[str, object] = {}
        first, second = Recorder(), Recorder()
        a = member(kafka.bootstrap, topic, group, "ksp-0", 0, first)
        b = member(kafka.bootstrap, topic, group, "ksp-1", 1, second)
        async with trio.open_nursery() as nursery:
            await nursery.start(a.run)
            await nursery.start(b.run)
            with trio.fail_after(30):
                split = await a.wait_for_map(lambda m: set(m.owners) == everything and len(m.instances) == 2
                                             and m.owned_by(0) and m.owned_by(1))
                await b.wait_for_map(lambda m: m.owners == split.owners)
                while first.owned | second.owned != everything:  # the callbacks have caught up
                    await trio.sleep(0.05)
            seen["split"] = (split.owned_by(0), split.owned_by(1))
            seen["callbacks"] = (frozenset(first.owned), frozenset(second.owned))
            seen["instances"] = [i.instance_id for i in split.instances]

            # A third instance claiming slot 1 is refused before it joins.
            try:
                await member(kafka.bootstrap, topic, group, "other-1", 1, Recorder()).run()
            except OwnershipError as refused:
                seen["conflict"] = str(refused)

            left = time.monotonic()
            await a.aclose()  # leaves the group: its partitions are revoked, then handed to b
            seen["a_events"] = list(first.events)
            with trio.fail_after(15):
                await b.wait_for_map(lambda m: set(m.owners) == everything and m.owned_by(1) == everything)
                while second.owned != everything:
                    await trio.sleep(0.05)
            seen["takeover_s"] = time.monotonic() - left
            seen["b_events"] = list(second.events)
            await b.aclose()
            nursery.cancel_scope.cancel()
        return seen

    seen = trio.run(scenario)
    mine, theirs = seen["split"]
    assert mine and theirs and mine | theirs == everything and not mine & theirs
    assert seen["callbacks"] == (mine, theirs)  # what each was handed is what the description says
    assert seen["instances"] == ["ksp-0", "ksp-1"]
    assert "slot 1 is already claimed by instance 'ksp-1'" in seen["conflict"]
    assert seen["a_events"][-1] == ("revoked", mine)  # a clean leave revokes, never "lost"
    assert ("gained", mine) in seen["b_events"]
    assert seen["takeover_s"] < 5.0, seen["takeover_s"]
    print(f"\nownership: split {sorted(mine)} / {sorted(theirs)}, take-over after a clean leave "
          f"{seen['takeover_s']:.2f} s")
