"""/healthz and /readyz on the metrics port, against a real broker.

* Readiness is false from process start until the share state is replayed (the replay is made
  to take 6 s longer with KSP_INJECT_REPLAY_DELAY_S, the rest is real: a real state topic on a real
  broker), true after; /healthz answers 200 throughout.
* Readiness is false while the (only) broker is stopped, true again after it restarts; /healthz
  stays 200.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from integration.kafka_fixtures import kafka_version
from integration.share.conftest import READY, SHARE_PROXY, RunningProxy
from proxy.localkafka import LocalKafka
from proxy.localkafka.broker import free_port

pytestmark = pytest.mark.integration

REPLAY_DELAY_S = 6


def probe(port: int, path: str) -> tuple[int, dict | str] | None:
    """(status, body) of GET path; None when nothing listens yet."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=3) as response:
            status, body = response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        status, body = error.code, error.read().decode()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None
    return status, (json.loads(body) if path == "/readyz" else body)


def wait_for_ready_state(port: int, ready: bool, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = probe(port, "/readyz")
        if last is not None and (last[0] == 200) == ready:
            assert last[1]["ready"] is ready
            return last[1]
        time.sleep(0.25)
    raise AssertionError(f"/readyz never became {'ready' if ready else 'not ready'}: {last}")


def test_not_ready_until_the_share_state_is_replayed(kafka, tmp_path: Path) -> None:
    port = free_port()
    log_path = tmp_path / "proxy.log"
    command = [SHARE_PROXY, "serve", "--upstream", kafka.bootstrap, "--listen", "127.0.0.1:0",
               "--state-topic", f"__share_proxy_state_{uuid.uuid4().hex[:12]}", "--metrics-port", str(port)]
    with log_path.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                   env={**os.environ, "KSP_INJECT_REPLAY_DELAY_S": str(REPLAY_DELAY_S)})
    observations: list[tuple[float, bool, int, dict]] = []  # (t, ready line printed, status, body)
    healthz: list[int] = []
    try:
        started = time.monotonic()
        while time.monotonic() - started < 60:
            printed = READY.search(log_path.read_bytes()) is not None
            answer = probe(port, "/readyz")
            if answer is not None:
                observations.append((time.monotonic() - started, printed, *answer))
                health = probe(port, "/healthz")
                assert health is not None
                healthz.append(health[0])
                if answer[0] == 200:
                    break
            assert process.poll() is None, log_path.read_text()
            time.sleep(0.2)
        not_ready = [o for o in observations if o[2] == 503]
        assert not_ready, f"never saw /readyz 503 during the replay: {observations}"
        # While replaying: not ready because of the replay, and the listeners are not open yet.
        replaying = [o for o in not_ready if not o[3]["checks"]["share_state_replayed"]]
        assert replaying, not_ready
        assert all("share_state_replayed" in o[3]["not_ready"] and not o[3]["checks"]["listening"]
                   and not o[1] for o in replaying), replaying
        # Replayed but the listeners not open yet: a short window, and the only thing missing.
        after_replay = not_ready[len(replaying):]
        assert all(not o[3]["checks"]["share_state_replayed"] for o in not_ready[:len(replaying)]), not_ready
        assert all(set(o[3]["not_ready"]) <= {"listening", "share_state_writable"} and not o[1]
                   for o in after_replay), after_replay
        # Not ready for (nearly) the whole injected delay: the probe is not just slow.
        assert replaying[-1][0] - replaying[0][0] >= REPLAY_DELAY_S - 2, replaying
        final = observations[-1]
        assert final[2] == 200, observations
        assert final[3]["checks"] == {"listening": True, "share_state_replayed": True,
                                      "share_state_writable": True, "upstream_reachable": True}
        assert set(healthz) == {200}, healthz
        metrics_answer = probe(port, "/metrics")
        assert metrics_answer is not None and metrics_answer[0] == 200
        assert "ksp_share_state_replay_seconds" in metrics_answer[1]
        replay_seconds = float(next(line.split()[1] for line in metrics_answer[1].splitlines()
                                    if line.startswith("ksp_share_state_replay_seconds ")))
        assert replay_seconds >= REPLAY_DELAY_S
    finally:
        process.terminate()
        assert process.wait(20) == 0, log_path.read_text()[-3000:]


@pytest.fixture(scope="module")
def restartable_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    kafka = LocalKafka(version=kafka_version(), share_groups=False, data_dir=tmp_path_factory.mktemp("health-kafka"),
                       port=free_port())
    kafka.start()
    try:
        yield kafka
    finally:
        kafka.stop()


def test_not_ready_while_the_broker_is_down(restartable_broker: LocalKafka, tmp_path: Path) -> None:
    port = free_port()
    proxy = RunningProxy(upstream=f"127.0.0.1:{restartable_broker.port}",
                         state_topic=f"__share_proxy_state_{uuid.uuid4().hex[:12]}",
                         flags=("--metrics-port", str(port)), log_path=tmp_path / "proxy").start()
    try:
        assert wait_for_ready_state(port, True, 20)["checks"]["upstream_reachable"] is True
        restartable_broker.stop()
        down = wait_for_ready_state(port, False, 20)
        assert "upstream_reachable" in down["not_ready"], down
        assert probe(port, "/healthz") == (200, "ok\n")
        restartable_broker.start()
        up = wait_for_ready_state(port, True, 60)
        assert all(up["checks"].values()), up
        assert probe(port, "/healthz") == (200, "ok\n")
    finally:
        if not restartable_broker.running:
            restartable_broker.start()
        assert proxy.stop() == 0, proxy.log_tail()
