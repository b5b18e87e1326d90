"""constraints.txt: every dependency `make demo` and `make test` install is pinned exactly.

pyproject.toml states the ranges the project supports; constraints.txt picks one version in each,
for the dependencies' dependencies too, so a new release on PyPI cannot change (or, with warnings
as errors, break) what those commands run. The Makefile must install through it.
"""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def pins() -> dict[str, str]:
    """{normalised name: version} from constraints.txt; fails on any line that is not `name==version`."""
    found: dict[str, str] = {}
    for number, raw in enumerate((ROOT / "constraints.txt").read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][A-Za-z0-9.+!-]*)", line)
        assert match, f"constraints.txt:{number}: {line!r} is not an exact pin (name==version)"
        name = canonicalize_name(match.group(1))
        assert name not in found, f"constraints.txt:{number}: {name} pinned twice"
        found[name] = match.group(2)
    return found


def direct_requirements() -> list[Requirement]:
    """The runtime dependencies and the `test` and `spark` extras (what the Makefile installs)."""
    project = PROJECT["project"]
    extras = project["optional-dependencies"]
    return [Requirement(text) for text in [*project["dependencies"], *extras["test"], *extras["spark"]]]


def test_constraints_are_exact_pins() -> None:
    assert pins()


def test_the_project_itself_is_not_pinned() -> None:
    assert canonicalize_name(PROJECT["project"]["name"]) not in pins()


@pytest.mark.parametrize("requirement", direct_requirements(), ids=str)
def test_every_direct_dependency_is_pinned_inside_its_range(requirement: Requirement) -> None:
    version = pins().get(canonicalize_name(requirement.name))
    assert version is not None, f"{requirement.name} is not in constraints.txt"
    assert requirement.specifier.contains(Version(version), prereleases=True), (
        f"constraints.txt pins {requirement.name}=={version}, outside pyproject.toml's {requirement}"
    )


def test_every_transitive_dependency_is_pinned() -> None:
    """Walks the installed distributions' requirements from pyproject.toml's list (markers evaluated)."""
    pinned = pins()
    unpinned: dict[str, str] = {}
    todo = direct_requirements()
    visited: set[str] = set()
    while todo:
        requirement = todo.pop()
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(requirement.name)
        if name in visited:
            continue
        visited.add(name)
        if name not in pinned:
            unpinned[name] = f"needed via {requirement}"
        try:
            distribution = metadata.distribution(requirement.name)
        except metadata.PackageNotFoundError:
            continue  # not installed here: its own requirements cannot be followed
        todo.extend(Requirement(text) for text in distribution.requires or [])
    assert unpinned == {}


def test_installing_tools_are_pinned_and_build_the_project() -> None:
    """The Makefile installs pip and setuptools from the constraints first; setuptools then builds
    the editable install without isolation, so its pin must meet [build-system]'s floor."""
    pinned = pins()
    assert "pip" in pinned
    floor = next(Requirement(text) for text in PROJECT["build-system"]["requires"]
                 if canonicalize_name(Requirement(text).name) == "setuptools")
    assert floor.specifier.contains(Version(pinned["setuptools"]))


def test_makefile_installs_through_the_constraints_and_reinstalls_when_they_change() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^CONSTRAINTS := constraints\.txt$", makefile, re.MULTILINE)
    installs = [line for line in makefile.splitlines() if "pip install" in line and "$(BIN)" in line]
    assert installs, "the Makefile installs nothing into .venv"
    for line in installs:
        assert "-c $(CONSTRAINTS)" in line, line
    assert any("-e '.[test,spark]'" in line for line in installs)
    stamp_rule = re.search(r"^\$\(STAMP\):(.*)$", makefile, re.MULTILINE)
    assert stamp_rule and "$(CONSTRAINTS)" in stamp_rule.group(1) and "pyproject.toml" in stamp_rule.group(1)


def test_the_update_procedure_is_written_down() -> None:
    comments = [line for line in (ROOT / "constraints.txt").read_text().splitlines() if line.startswith("#")]
    assert any("make constraints" in line for line in comments)
    assert re.search(r"^constraints:", (ROOT / "Makefile").read_text(), re.MULTILINE)
