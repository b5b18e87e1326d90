"""The chart's alert rules (helm/templates/prometheusrule.yaml) evaluated by Prometheus's own promtool.

The rules are rendered from helm/ci/default-values.yaml, which enables them with the defaults.
`promtool check rules` accepts them, templates included. `promtool test rules` then feeds each
alert the series it is about: it must fire, with the labels routing needs, after its `for`. It must
stay quiet on a healthy pod or group, and on series of another namespace (the default selector).
The annotations are left out of the evaluated copy: promtool compares them verbatim, and they are
prose.

promtool is found at ``$KSP_PROMTOOL``, else where ``make promtool`` builds it. `make test` does not
build it: cold, that takes ~5.5 minutes on two cores, more than CI's budget has to spare. Without
it these tests skip and say so.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helm.chart import (
    CI_VALUES, NAMESPACE, PROMTOOL_SKIP_REASON, SKIP_REASON, find_helm, find_promtool, render,
)

PROMTOOL = find_promtool()

pytestmark = [
    pytest.mark.skipif(find_helm() is None, reason=SKIP_REASON),
    pytest.mark.skipif(PROMTOOL is None, reason=PROMTOOL_SKIP_REASON),
]

OTHER_NAMESPACE = "elsewhere"


@pytest.fixture(scope="module")
def rule_groups() -> list[dict[str, Any]]:
    (default,) = [path for path in CI_VALUES if path.name == "default-values.yaml"]
    return render([default]).one("PrometheusRule")["spec"]["groups"]


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(PROMTOOL), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_promtool_accepts_the_rendered_rules_and_their_templates(rule_groups, tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rule_groups}))
    checked = promtool("check", "rules", "rules.yaml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {sum(len(group['rules']) for group in rule_groups)} rules found" in checked.stdout, checked.stdout


def series(name: str, values: str, **labels: str) -> dict[str, str]:
    """An input series in `namespace` NAMESPACE unless `labels` name another; one sample a minute."""
    labels = {"namespace": NAMESPACE, **labels}
    return {"series": name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}", "values": values}


def firing(alert: str, at: str, *expected: dict[str, str]) -> dict[str, Any]:
    """`alert` fires at `at` for exactly these label sets (none: it does not fire)."""
    return {"eval_time": at, "alertname": alert,
            "exp_alerts": [{"exp_labels": {"namespace": NAMESPACE, "severity": "warning", **labels}}
                           for labels in expected]}


# Each case: the series, then when each alert fires and for whom. Every series runs two hours, a
# sample a minute (promtool's expanding notation: "0+1x120" counts up by one for 120 minutes).
CASES: dict[str, tuple[list[dict[str, str]], list[dict[str, Any]]]] = {
    "state writes failing": (
        [series("ksp_share_state_writes_total", "0+1x120", pod="p-0", outcome="failed"),
         series("ksp_share_state_writes_total", "0+50x120", pod="p-0", outcome="ok"),
         series("ksp_share_state_writes_total", "3x120", pod="p-1", outcome="failed"),  # failed once, long ago
         series("ksp_share_state_writes_total", "0+1x120", pod="p-2", outcome="failed", namespace=OTHER_NAMESPACE)],
        [firing("KafkaShareProxyStateWriteFailures", "1m"),  # pending: `for` is 2m
         firing("KafkaShareProxyStateWriteFailures", "10m", {"pod": "p-0"})],
    ),
    "state topic not writable": (
        [series("ksp_share_state_writable", "1 1 1 0x117", pod="p-0"),
         series("ksp_share_state_writable", "1x120", pod="p-1")],
        [firing("KafkaShareProxyStateNotWritable", "4m"),  # 0 since 3m, for 2m
         firing("KafkaShareProxyStateNotWritable", "6m", {"pod": "p-0"})],
    ),
    "records archived": (
        [series("ksp_share_group_records_archived_total", "0+2x120", pod="p-0", group="orders", reason="delivery_limit"),
         series("ksp_share_group_records_archived_total", "0+1x120", pod="p-1", group="orders", reason="delivery_limit"),
         series("ksp_share_group_records_archived_total", "0+5x120", pod="p-0", group="audit", reason="released"),
         series("ksp_share_group_records_archived_total", "7x120", pod="p-0", group="quiet", reason="rejected")],
        [firing("KafkaShareProxyRecordsArchived", "8m"),  # `for` is 10m
         firing("KafkaShareProxyRecordsArchived", "20m", {"group": "orders", "reason": "delivery_limit"})],
    ),
    "stale IN_PROGRESS": (
        [series("ksp_share_group_records_in_progress_stale", "0 0 3x118", pod="p-0", group="slow"),
         series("ksp_share_group_records_in_progress_stale", "0x120", pod="p-0", group="fine")],
        [firing("KafkaShareProxyStaleInProgress", "10m"),  # stale since 2m, `for` is 15m
         firing("KafkaShareProxyStaleInProgress", "30m", {"group": "slow"})],
    ),
    "lag growing": (
        [series("ksp_share_group_lag_records", "0+10x120", pod="p-0", group="behind"),
         series("ksp_share_group_lag_records", "500x120", pod="p-0", group="steady"),
         series("ksp_share_group_lag_records", "1200-10x120", pod="p-0", group="draining")],
        [firing("KafkaShareProxyLagGrowing", "20m"),  # `for` is 30m
         firing("KafkaShareProxyLagGrowing", "60m", {"group": "behind"})],
    ),
    "read cache too small": (
        [series("ksp_share_upstream_fetch_bytes_total", "0+1000x120", pod="p-0"),
         series("ksp_share_read_cache_evicted_bytes_total", "0+500x120", pod="p-0"),  # drops half of what it reads
         series("ksp_share_upstream_fetch_bytes_total", "0+1000x120", pod="p-1"),
         series("ksp_share_read_cache_evicted_bytes_total", "0+200x120", pod="p-1")],  # a fifth: under 0.25
        [firing("KafkaShareProxyReadCacheTooSmall", "20m"),  # `for` is 30m
         firing("KafkaShareProxyReadCacheTooSmall", "60m", {"pod": "p-0"})],
    ),
}


def test_every_alert_of_the_chart_has_a_case(rule_groups) -> None:
    alerts = {rule["alert"] for group in rule_groups for rule in group["rules"]}
    assert alerts == {test["alertname"] for _, tests in CASES.values() for test in tests}


@pytest.mark.parametrize("case", CASES)
def test_each_alert_fires_on_what_it_is_about_after_its_for_and_not_on_healthy_series(
        case: str, rule_groups, tmp_path: Path) -> None:
    bare = [{**group, "rules": [{k: v for k, v in rule.items() if k != "annotations"} for rule in group["rules"]]}
            for group in rule_groups]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": bare}))
    input_series, alert_tests = CASES[case]
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump({
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [{"name": case, "interval": "1m", "input_series": input_series, "alert_rule_test": alert_tests}],
    }))
    tested = promtool("test", "rules", "tests.yaml", cwd=tmp_path)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout, tested.stdout
