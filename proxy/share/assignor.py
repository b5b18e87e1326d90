"""Server-side share-group assignor: balanced and sticky.

Theory of operation
-------------------
A share group does not need partitions kept apart between members: a partition may be
fetched by several members at once (KIP-932, "Share group membership"). The aim is to give
every member useful work and every partition at least one consumer, evenly, while moving as
little as possible between rebalances. Kafka 4.1+'s ``SimpleAssignor`` does this for a
homogeneous group (all members subscribed to the same topics) with two targets:

* **desired sharing** -- every partition is assigned to ``ceil(M / P)`` members
  (``M`` members, ``P`` partitions), so when members outnumber partitions each partition is
  shared, and when partitions outnumber members each partition has exactly one member;
* **desired load** -- the ``ceil(M / P) * P`` assignment slots are split between members so
  that any two members' partition counts differ by at most one.

This module reaches exactly those targets for homogeneous groups and generalises them to
heterogeneous subscriptions: each member spreads one unit of demand evenly over the
partitions it may take; a topic's desired sharing is the ceiling of the demand on each of
its partitions, and a member's desired load is its proportional share of the slots
(exact fractions, largest-remainder rounding). The assignment is then built in passes:

1. keep every currently assigned partition that is still subscribed and still exists;
2. revoke from partitions shared by more members than desired (from the most loaded first);
3. revoke from members holding more than their desired load (their most shared first);
4. fill under-shared partitions, least shared first, with the least loaded eligible member
   that still has room; when every member with room already holds the partition, a swap
   (give one of another member's partitions to the member with room, and the needy
   partition to that other member) keeps the fill going -- in a homogeneous group such a
   swap always exists, so the targets are always met;
5. a safety net for heterogeneous groups: no partition with an eligible member stays
   unassigned and no member with eligible partitions stays idle.

Everything iterates in sorted order, so the result is a pure function of the inputs.
"""

from __future__ import annotations

import heapq
import math
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction

__all__ = [
    "ASSIGNOR_NAME",
    "TopicIdPartition",
    "SimpleAssignor",
    "assign",
    "desired_sharing",
]

#: The name ShareGroupDescribe reports, as Kafka's ``SimpleAssignor.name()`` does.
ASSIGNOR_NAME = "simple"

TopicIdPartition = tuple[uuid.UUID, int]
"""(topic id, partition index)."""


def desired_sharing(num_members: int, num_partitions: int) -> int:
    """How many members each partition gets in a homogeneous group: ``ceil(M / P)``."""
    if num_members <= 0 or num_partitions <= 0:
        return 0
    return -(-num_members // num_partitions)


@dataclass(frozen=True, slots=True)
class SimpleAssignor:
    """The pluggable face of :func:`assign` (one assignor today, as in Kafka)."""

    name: str = ASSIGNOR_NAME

    def assign(
        self,
        subscriptions: Mapping[str, Iterable[uuid.UUID]],
        partition_counts: Mapping[uuid.UUID, int],
        current: Mapping[str, Iterable[TopicIdPartition]] | None = None,
    ) -> dict[str, frozenset[TopicIdPartition]]:
        return assign(subscriptions, partition_counts, current)


def assign(
    subscriptions: Mapping[str, Iterable[uuid.UUID]],
    partition_counts: Mapping[uuid.UUID, int],
    current: Mapping[str, Iterable[TopicIdPartition]] | None = None,
) -> dict[str, frozenset[TopicIdPartition]]:
    """Compute the target assignment.

    ``subscriptions``: member id -> subscribed topic ids (topics missing from
    ``partition_counts`` are ignored, as Kafka ignores topics absent from metadata).
    ``partition_counts``: topic id -> number of partitions.
    ``current``: the previous target assignment, for stickiness.
    Returns member id -> assigned partitions, with an entry for every member.
    """
    return _Builder(subscriptions, partition_counts, current or {}).build()


class _Builder:
    def __init__(
        self,
        subscriptions: Mapping[str, Iterable[uuid.UUID]],
        partition_counts: Mapping[uuid.UUID, int],
        current: Mapping[str, Iterable[TopicIdPartition]],
    ) -> None:
        self.members = sorted(subscriptions)
        self.eligible_topics: dict[str, frozenset[uuid.UUID]] = {
            m: frozenset(t for t in subscriptions[m] if partition_counts.get(t, 0) > 0)
            for m in self.members
        }
        self.partition_counts = {
            t: partition_counts[t]
            for t in sorted({t for ts in self.eligible_topics.values() for t in ts})
        }
        self.subscribers: dict[uuid.UUID, list[str]] = {t: [] for t in self.partition_counts}
        for m in self.members:
            for t in self.eligible_topics[m]:
                self.subscribers[t].append(m)
        self.current = current

        self.held: dict[str, set[TopicIdPartition]] = {m: set() for m in self.members}
        self.holders: dict[TopicIdPartition, set[str]] = {
            (t, p): set() for t, n in self.partition_counts.items() for p in range(n)
        }
        self.sharing: dict[uuid.UUID, int] = {}
        self.quota: dict[str, int] = {}

    # -- targets -------------------------------------------------------------------------

    def _eligible_count(self, member: str) -> int:
        return sum(self.partition_counts[t] for t in self.eligible_topics[member])

    def _compute_targets(self, kept_load: Mapping[str, int]) -> None:
        demand_per_partition: dict[uuid.UUID, Fraction] = {t: Fraction(0) for t in self.partition_counts}
        eligible_count = {m: self._eligible_count(m) for m in self.members}
        for m in self.members:
            if eligible_count[m]:
                for t in self.eligible_topics[m]:
                    demand_per_partition[t] += Fraction(1, eligible_count[m])
        for t, demand in demand_per_partition.items():
            self.sharing[t] = max(1, min(math.ceil(demand), len(self.subscribers[t])))

        shares: dict[str, Fraction] = {}
        for m in self.members:
            share = Fraction(0)
            for t in self.eligible_topics[m]:
                slots = self.sharing[t] * self.partition_counts[t]
                share += slots * Fraction(1, eligible_count[m]) / demand_per_partition[t]
            shares[m] = share
        total = sum(self.sharing[t] * n for t, n in self.partition_counts.items())
        floors = {m: math.floor(s) for m, s in shares.items()}
        remainder = total - sum(floors.values())
        # Largest remainder first; among equals, members already holding more keep the
        # extra slot (stickiness), then member id for determinism.
        order = sorted(self.members, key=lambda m: (-(shares[m] - floors[m]), -kept_load[m], m))
        for m in order[:max(remainder, 0)]:
            floors[m] += 1
        for m in self.members:
            limit = eligible_count[m]
            self.quota[m] = min(max(floors[m], 1 if limit else 0), limit)

    # -- mutation helpers ----------------------------------------------------------------

    def _add(self, member: str, tp: TopicIdPartition) -> None:
        self.held[member].add(tp)
        self.holders[tp].add(member)

    def _remove(self, member: str, tp: TopicIdPartition) -> None:
        self.held[member].discard(tp)
        self.holders[tp].discard(member)

    def _can_take(self, member: str, tp: TopicIdPartition) -> bool:
        return tp[0] in self.eligible_topics[member] and tp not in self.held[member]

    # -- passes --------------------------------------------------------------------------

    def _keep_current(self) -> dict[str, int]:
        for m in self.members:
            for tp in sorted(self.current.get(m, ())):
                if tp in self.holders and tp[0] in self.eligible_topics[m]:
                    self._add(m, tp)
        return {m: len(self.held[m]) for m in self.members}

    def _revoke_overshared(self) -> None:
        for tp in sorted(self.holders):
            holders = self.holders[tp]
            excess = len(holders) - self.sharing[tp[0]]
            if excess <= 0:
                continue
            by_overload = sorted(holders, key=lambda m: (-(len(self.held[m]) - self.quota[m]), m))
            for m in by_overload[:excess]:
                self._remove(m, tp)

    def _revoke_overfilled(self) -> None:
        for m in self.members:
            excess = len(self.held[m]) - self.quota[m]
            if excess <= 0:
                continue
            # Give up the partitions that others also hold first, so coverage survives.
            by_sharing = sorted(self.held[m], key=lambda tp: (-len(self.holders[tp]), tp))
            for tp in by_sharing[:excess]:
                self._remove(m, tp)

    def _fill(self) -> None:
        heap = [
            (len(h), tp) for tp, h in self.holders.items() if len(h) < self.sharing[tp[0]]
        ]
        heapq.heapify(heap)
        while heap:
            count, tp = heapq.heappop(heap)
            if count != len(self.holders[tp]):
                continue  # stale entry
            if not (self._give_to_member_with_room(tp) or self._swap_into(tp)):
                continue  # no way to share this partition further (heterogeneous groups)
            if len(self.holders[tp]) < self.sharing[tp[0]]:
                heapq.heappush(heap, (len(self.holders[tp]), tp))

    def _give_to_member_with_room(self, tp: TopicIdPartition) -> bool:
        best: str | None = None
        for m in self.subscribers[tp[0]]:
            if len(self.held[m]) < self.quota[m] and tp not in self.held[m]:
                if best is None or len(self.held[m]) < len(self.held[best]):
                    best = m
        if best is None:
            return False
        self._add(best, tp)
        return True

    def _swap_into(self, tp: TopicIdPartition) -> bool:
        """Member X has room but already holds ``tp``; member Y is full and does not.

        Move some partition r from Y to X and give ``tp`` to Y: Y's load and r's sharing
        are unchanged, X gains one, ``tp`` gains one member.
        """
        with_room = [
            m for m in self.subscribers[tp[0]]
            if len(self.held[m]) < self.quota[m] and tp in self.held[m]
        ]
        without = [m for m in self.subscribers[tp[0]] if tp not in self.held[m]]
        for x in with_room:
            for y in without:
                for r in sorted(self.held[y]):
                    if self._can_take(x, r):
                        self._remove(y, r)
                        self._add(x, r)
                        self._add(y, tp)
                        return True
        return False

    def _ensure_coverage(self) -> None:
        for tp in sorted(self.holders):
            if not self.holders[tp]:
                candidates = self.subscribers[tp[0]]
                if candidates:
                    self._add(min(candidates, key=lambda m: (len(self.held[m]), m)), tp)
        for m in self.members:
            if not self.held[m] and self.eligible_topics[m]:
                options = [
                    (t, p) for t in sorted(self.eligible_topics[m])
                    for p in range(self.partition_counts[t])
                ]
                self._add(m, min(options, key=lambda tp: (len(self.holders[tp]), tp)))

    def build(self) -> dict[str, frozenset[TopicIdPartition]]:
        kept_load = self._keep_current()
        self._compute_targets(kept_load)
        self._revoke_overshared()
        self._revoke_overfilled()
        self._fill()
        self._ensure_coverage()
        return {m: frozenset(self.held[m]) for m in self.members}
