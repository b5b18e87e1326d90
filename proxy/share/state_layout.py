"""Bringing the state topic to layout 2 before share groups are served (docs/scale-out.md, step 1).

Layout 2 places every record of a share-partition on ``crc32(topic id + partition) % N`` and a
group's records on ``crc32("group:" + group id) % N`` (:mod:`proxy.share.state_store`), and says
so with a marker record on partition 0. A topic written by an earlier version (layout 1), one whose
partition count grew since its marker, or one holding records a migration cut short left off their
home partition, is migrated at start by :func:`migrate`, in three durable steps:

1. **copies**: the winning record of every key found off its home partition, written at home
   (snapshots before updates, byte for byte: same epochs, same state);
2. **tombstones** of the old copies, each on the partition it sits on (never at home: a tombstone
   there would delete the copy just written);
3. the **marker** ``{layout: 2, partitions: N}``.

Each step is idempotent and replay is order-independent across partitions (the home copy wins),
so a crash anywhere is repaired by the next start: after step 1 the copies win and the migration
is planned again with only tombstones; after step 2 only the marker is left to write.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import structlog

from proxy.share import state_store
from proxy.share.persister import StateRecord

log = structlog.get_logger(__name__)


class StateWriter(Protocol):
    async def write(self, topic: str, records: list[StateRecord]) -> None: ...


@dataclass(frozen=True, slots=True)
class MigrationOutcome:
    copied: int
    tombstoned: int
    partitions: int


async def migrate(writer: StateWriter, topic: str, recovered: state_store.RecoveredState,
                  partitions: int) -> MigrationOutcome:
    """Write what brings ``topic`` (``partitions`` partitions) to layout 2; PersistError from the
    writer if a step does not become durable (the caller retries: every step is idempotent)."""
    plan = recovered.migration
    if plan.copies:
        await writer.write(topic, list(plan.copies))
    if plan.tombstones:
        await writer.write(topic, [(key, None, partition) for key, partition in plan.tombstones])
    await writer.write(topic, [state_store.layout_record(partitions)])
    outcome = MigrationOutcome(len(plan.copies), len(plan.tombstones), partitions)
    if recovered.layout is None and not plan:
        log.info("state topic marked layout 2", topic=topic, partitions=partitions)
    else:
        log.warning("state topic migrated to layout 2", topic=topic, partitions=partitions,
                    found=None if recovered.layout is None else
                    {"layout": recovered.layout.layout, "partitions": recovered.layout.partitions},
                    copied=outcome.copied, tombstoned=outcome.tombstoned)
    return outcome
