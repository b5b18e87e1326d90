"""Fixtures and helpers for the Python client's integration tests (the share-group fixtures, reused)."""

from __future__ import annotations

import threading
import time

import client
from integration.share.conftest import create_topic, module_share_proxy, names, share_proxy  # noqa: F401

# The share-group fixtures, re-exported for the tests in this folder.
__all__ = ["create_topic", "module_share_proxy", "names", "share_proxy"]

EXPLICIT = {"share.acknowledgement.mode": "explicit"}


def consumer(proxy, group: str, topic: str, **config: object) -> client.ShareConsumer:
    settings: dict[str, object] = {"bootstrap.servers": proxy.bootstrap, "group.id": group}
    settings.update(config)
    share = client.ShareConsumer(settings)
    share.subscribe([topic])
    return share


def poll_until(share: client.ShareConsumer, wanted: int, timeout: float = 30.0) -> list[client.Message]:
    """Poll until at least ``wanted`` records arrived; returns them (acknowledging nothing)."""
    got: list[client.Message] = []
    deadline = time.monotonic() + timeout
    while len(got) < wanted:
        assert time.monotonic() < deadline, f"got {len(got)} of {wanted} records in {timeout}s"
        for message in share.poll(0.5):
            assert message.error() is None, message.error()
            got.append(message)
    return got


def log_ends(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": "probe"})
    try:
        return {p: probe.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions)}
    finally:
        probe.close()


class PythonClientThread(threading.Thread):
    """Polls a client.ShareConsumer (implicit mode) until stopped, recording deliveries."""

    def __init__(self, proxy, group: str, topic: str, processing_s: float = 0.0) -> None:
        super().__init__(name="python-client", daemon=True)
        self.share = consumer(proxy, group, topic)
        self.processing_s = processing_s
        self.deliveries: list[tuple[int, int, int, bytes]] = []
        self.errors: list[str] = []
        self._stop_requested = threading.Event()

    def run(self) -> None:
        try:
            while not self._stop_requested.is_set():
                messages = self.share.poll(0.2)
                for message in messages:
                    if message.error() is not None:
                        self.errors.append(str(message.error()))
                        continue
                    self.deliveries.append((message.partition(), message.offset(), message.delivery_count(),
                                            message.value()))
                if messages and self.processing_s:
                    time.sleep(self.processing_s)
        except Exception as exc:  # noqa: BLE001 - reported through `errors`
            self.errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            self.share.close()

    def finish(self) -> None:
        self._stop_requested.set()
        self.join(30)
        assert not self.is_alive()


def set_group_configs(bootstrap: str, group: str, configs: dict[str, str]) -> None:
    """IncrementalAlterConfigs (SET) on a share group's configs, through the proxy."""
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
        ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET) for name, value in configs.items()])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)
