"""Share-group metrics (prometheus-client), beside the proxy's connection counters."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

STATE_WRITES = Counter("ksp_share_state_writes", "Batched writes to the share-state topic", ["outcome"])
STATE_WRITE_SECONDS = Histogram("ksp_share_state_write_seconds", "Latency of one batched state-topic write")
STATE_WRITE_BYTES = Counter("ksp_share_state_write_bytes", "Key and value bytes written to the state topic")
STATE_PARTITION_RECORDS = Counter("ksp_share_state_partition_records",
                                  "Share-partition state records written: snapshot, or cumulative update "
                                  "(--state-deltas on)", ["kind"])
STATE_WRITABLE = Gauge("ksp_share_state_writable", "0 from a failed state-topic write until the next one succeeds, else 1")
STATE_PRODUCER_RECREATED = Counter("ksp_share_state_producer_recreated",
                                   "State producers replaced after a fatal producer error or a timed-out state write")
STATE_PARTITION_OWNED = Gauge("ksp_share_state_partition_owned",
                              "1 for each state-topic partition this instance owns in scale-out mode (--instance-id), "
                              "0 once given up", ["partition"])
OWNER_MAP_KNOWN = Gauge("ksp_ownership_known_owners",
                        "State-topic partitions this instance's owner map names an owner for (scale-out); "
                        "below the partition count while a hand-over is under way")
STATE_LANES_FENCED = Counter("ksp_share_state_lanes_fenced",
                             "State-topic partitions this instance stopped writing because another producer took "
                             "over their transactional id (--state-fencing transactional)")
PEER_CALLS = Counter("ksp_peer_calls", "Calls this instance made to other instances (scale-out: admin, config "
                     "mirror, membership watch)")
PEER_CONNECTIONS_OPENED = Counter("ksp_peer_connections_opened",
                                  "Connections this instance opened to other instances (kept for the next call)")
ACKNOWLEDGEMENTS = Counter("ksp_share_acknowledged_partitions", "Per-partition acknowledgements applied")
ACKNOWLEDGEMENTS_ROLLED_BACK = Counter("ksp_share_acknowledgements_rolled_back",
                                       "Staged acknowledgements rolled back because their state write failed")
RECORDS_ACQUIRED = Counter("ksp_share_records_acquired", "Records acquired by share consumers")
SELF_PINNED_ANSWERS = Counter("ksp_share_fetch_self_pinned",
                              "ShareFetches answered empty before MaxWaitMs because their member held the record "
                              "pinning a full record-lock window")
FETCH_WAKEUPS = Counter("ksp_share_fetch_wakeups",
                        "Waiting ShareFetches woken by a release, an expiry or new records upstream, by what the "
                        "round after the wake-up found: records, or nothing (another fetch took them first)",
                        ["outcome"])
BACKGROUND_TASK_CRASHES = Counter("ksp_background_task_crashes",
                                  "Unexpected errors in background tasks (each restarted with backoff)", ["task"])
READ_CACHE_BYTES = Gauge("ksp_share_read_cache_bytes", "Log bytes held by the share-partition read caches")
READ_CACHE_EVICTED_BYTES = Counter("ksp_share_read_cache_evicted_bytes",
                                   "Log bytes the read-cache budget dropped to make room for a read "
                                   "(read again if their records are still wanted)")
UPSTREAM_FETCHES = Counter("ksp_share_upstream_fetches",
                           "Fetch requests the share service sent to the cluster for share groups' records "
                           "(kind: read, or long_poll for a caught-up partition)", ["kind"])
UPSTREAM_FETCH_PARTITIONS = Counter("ksp_share_upstream_fetch_partitions",
                                    "Partitions those Fetch requests asked for (several per request: one per leader)")
UPSTREAM_FETCH_BYTES = Counter("ksp_share_upstream_fetch_bytes",
                               "Log bytes those Fetch requests brought in (records as the broker stores them)")
METADATA_REFRESHES = Counter("ksp_share_metadata_refreshes", "Upstream metadata refreshes by the share service",
                             ["reason"])
LEADERS = Gauge("ksp_share_partitions_led", "Share-partitions in memory", ["state"])
STATE_RECORDS_SKIPPED = Counter(
    "ksp_share_state_records_skipped", "State-topic records replay could not decode or apply, and skipped"
)
STATE_TOPIC_REFUSALS = Counter(
    "ksp_share_state_topic_refusals", "Client requests refused for writing to or changing the state topic", ["api_key"]
)
STATE_REPLAY_SECONDS = Gauge("ksp_share_state_replay_seconds",
                             "Seconds start-up took to create/replay the state topic and rebuild the engines")
STATE_REPLAY_RECORDS = Gauge("ksp_share_state_replay_records", "State-topic records read by the start-up replay")
# The share-group event log (proxy/share/event_log.py, docs/event-log.md).
EVENTS_PUBLISHED = Counter("ksp_share_events_published", "Share-group events the event topic acknowledged")
EVENTS_DROPPED = Counter("ksp_share_events_dropped",
                         "Share-group events not published: buffer_full, delivery_failed, encode_failed", ["reason"])
EVENTS_BUFFERED = Gauge("ksp_share_events_buffered",
                        "Share-group events held for the event topic (buffer and producer queue together)")
# KIP-1191 dead-letter queues (proxy/share/dead_letters.py, docs/dead-letters.md).
DEAD_LETTER_RECORDS = Counter("ksp_share_dead_letter_records", "Dead letters written to share groups' DLQ topics",
                              ["group", "reason"])
DEAD_LETTER_FAILURES = Counter("ksp_share_dead_letter_failures",
                               "Records archived without a dead letter: the DLQ topic failed Kafka's checks, none is "
                               "configured any more, or the topic refused them", ["group", "reason"])
RECORDS_ARCHIVING = Gauge("ksp_share_records_archiving", "Records ARCHIVING: their dead-letter write pending")
# Share operations authorized by the cluster's ACLs (proxy/share/authorization.py, docs/security.md).
AUTHORIZATION_DENIED = Counter("ksp_authorization_denied",
                               "Share operations (or parts of one) refused because the cluster's ACLs deny them",
                               ["api", "resource"])
AUTHORIZATION_PROBES = Counter("ksp_authorization_probes",
                               "Authorization probes sent on clients' own connections (cache misses)", ["operation"])
