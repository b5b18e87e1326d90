"""The chart's documentation and set-up, checked without running helm: every value in
values.yaml has a `## @param` line and a row in helm/README.md's parameters table, and the tests
look for the helm and promtool the Makefile builds."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from tests.helm.chart import CHART, HELM_VERSION, PROMTOOL_VERSION, ROOT


@pytest.mark.parametrize(("tool", "version"), [("helm", HELM_VERSION), ("promtool", PROMTOOL_VERSION)])
def test_the_tool_looked_for_is_the_one_the_makefile_builds(tool: str, version: str) -> None:
    makefile = (ROOT / "Makefile").read_text()
    variable = f"{tool.upper()}_VERSION"
    assert re.search(rf"^{variable} := {re.escape(version)}$", makefile, re.MULTILINE)
    assert f"$(HOME)/.cache/kafka-share-proxy/{tool}-$({variable})" in makefile


# -- documentation ----------------------------------------------------------------------------------


def leaf_paths(tree: Any, prefix: str = "") -> set[str]:
    """Dotted paths of values.yaml's documented fields: leaves, and maps documented as a whole."""
    if isinstance(tree, dict) and tree:
        return {path for key, value in tree.items() for path in leaf_paths(value, f"{prefix}{key}.")}
    return {prefix.rstrip(".")}


def test_every_value_is_documented_with_a_param_line_and_in_the_readme() -> None:
    text = (CHART / "values.yaml").read_text()
    params = set(re.findall(r"^\s*## @param (\S+) ", text, re.MULTILINE))
    values = yaml.safe_load(text)
    # A map documented as a whole (resources, podSecurityContext, ...) counts for its keys.
    undocumented = {path for path in leaf_paths(values)
                    if not any(path == p or path.startswith(p + ".") for p in params)}
    assert undocumented == set()
    assert {p for p in params if not _has_path(values, p)} == set()
    readme = (CHART / "README.md").read_text()
    assert {p for p in params if f"| `{p}` |" not in readme} == set()


def _has_path(tree: dict[str, Any], dotted: str) -> bool:
    for key in dotted.split("."):
        if not isinstance(tree, dict) or key not in tree:
            return False
        tree = tree[key]
    return True
