"""pyproject.toml: metadata a fresh clone can build, and that claims nothing the project lacks."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

# setuptools reads `license = "<SPDX expression>"` (PEP 639) from 77.0.1 on; 76.x rejects the
# string ("must be valid exactly by one definition"); 77.0.0 is not on PyPI.
FIRST_SETUPTOOLS_WITH_SPDX_LICENSE = Version("77.0.1")


def setuptools_floor() -> SpecifierSet:
    for text in PYPROJECT["build-system"]["requires"]:
        requirement = Requirement(text)
        if canonicalize_name(requirement.name) == "setuptools":
            return requirement.specifier
    raise AssertionError("[build-system] requires no setuptools")


def test_setuptools_floor_reads_an_spdx_license_string() -> None:
    assert isinstance(PYPROJECT["project"]["license"], str)
    floor = setuptools_floor()
    assert not floor.contains(Version("76.1.0")), f"setuptools{floor} admits 76.x, which rejects the licence"
    assert floor.contains(FIRST_SETUPTOOLS_WITH_SPDX_LICENSE)


def test_description_names_what_is_built_and_calls_nothing_built_planned() -> None:
    # IN_PROGRESS (issue 10), dead letters and the event log (issue 11) are served, not planned.
    description = PYPROJECT["project"]["description"]
    for built in ("share groups", "IN_PROGRESS", "dead-letter", "event log"):
        assert built in description, description
    assert "planned" not in description and "roadmap" not in description, description


def test_python_floor_matches_the_makefile() -> None:
    assert PYPROJECT["project"]["requires-python"] == ">=3.11"
    assert "PYTHON_MIN := 3.11" in (ROOT / "Makefile").read_text()
