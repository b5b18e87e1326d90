"""Integration fixtures: a real Apache Kafka broker, the proxy in front of it, topics.

`KSP_KAFKA_VERSION` picks the broker (default 4.4.0); CI runs the suite once per version.
Every test under integration/ is marked `integration` automatically.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from integration.kafka_fixtures import ProxyProcess, create_topic, kafka_version, unique_name
from proxy.localkafka import LocalKafka
from proxy.localkafka.config import supports_share_groups

INTEGRATION_DIR = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if INTEGRATION_DIR in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.integration)


def pytest_report_header(config: pytest.Config) -> str:
    return f"integration: Apache Kafka {kafka_version()} (env KSP_KAFKA_VERSION)"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[pytest.TestReport]:
    """On failure, attach where the broker logs and the tail of the proxy's log to the report."""
    report = yield
    if report.failed and isinstance(item, pytest.Function):
        for name in ("kafka", "secured_kafka"):
            broker = item.funcargs.get(name)
            if isinstance(broker, LocalKafka) and broker.log_path is not None:
                report.sections.append((name, f"Apache Kafka {broker.version} log: {broker.log_path}"))
        running = item.funcargs.get("proxy")
        if isinstance(running, ProxyProcess):
            tail = "\n".join(running.log_text().splitlines()[-60:])
            report.sections.append(("share-proxy serve log (tail)", f"{running.log_path}\n{tail}"))
    return report


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    """A single-node Kafka broker with share groups off; `.bootstrap`, `.version`, `.broker_id`.

    Its data and server.log live under pytest's temporary directory, kept after the run.
    """
    data_dir = tmp_path_factory.mktemp("kafka")
    with LocalKafka(version=kafka_version(), share_groups=False, data_dir=data_dir) as broker:
        yield broker


@pytest.fixture(scope="session")
def native_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    """A second broker with Kafka's own share groups on (4.x only), for side-by-side comparisons."""
    version = kafka_version()
    if not supports_share_groups(version):
        pytest.skip(f"Apache Kafka {version} has no native share groups (KIP-932 needs 4.x)")
    with LocalKafka(version=version, share_groups=True, data_dir=tmp_path_factory.mktemp("native-kafka")) as broker:
        yield broker


@pytest.fixture(scope="session")
def secured_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    """A SASL_SSL broker (SCRAM-SHA-512 users admin, alice, bob; StandardAuthorizer; no ACLs yet).

    Started only by the tests that ask for it. `.client_config(user)` gives confluent-kafka
    settings, `.java_properties(user)` Java ones, `.ca_path` the CA, `.certificates.issue(...)`
    more certificates from the same CA; `integration.security_fixtures.grant/revoke` set ACLs.
    """
    data_dir = tmp_path_factory.mktemp("secured-kafka")
    with LocalKafka(version=kafka_version(), security="sasl_ssl", data_dir=data_dir) as broker:
        yield broker


@pytest.fixture(scope="session")
def proxy(kafka: LocalKafka, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    """`share-proxy serve --upstream <kafka> --listen 127.0.0.1:0`; `.bootstrap` is the proxy's."""
    log_path = tmp_path_factory.mktemp("proxy") / "serve.log"
    with ProxyProcess(upstream=kafka.bootstrap, log_path=log_path) as running:
        yield running


@pytest.fixture
def topic(kafka: LocalKafka, request: pytest.FixtureRequest) -> str:
    """A fresh one-partition topic, created directly on the broker."""
    return create_topic(kafka.bootstrap, unique_name(re.sub(r"[^a-zA-Z0-9._-]+", "-", request.node.name)[:40]))
