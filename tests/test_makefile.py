"""The setup path a new user takes: the Makefile's choice of Python and its .venv handling.

These run the real Makefile with GNU make, against fake interpreters: small shell scripts named
python3.X that report a chosen version, and, once "-m venv" made a fake .venv, record every pip
call instead of installing anything. PATH holds only the fakes (plus the few tools the recipes
use), so the machine's own Pythons cannot be picked by accident.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAKE = shutil.which("make")
CANDIDATES = ("python3.11", "python3.12", "python3.13", "python3")

pytestmark = pytest.mark.skipif(MAKE is None, reason="GNU make is not installed")

# A fake interpreter reporting VERSION. "-c <probe>" prints the version; "-m venv DIR" makes a
# fake venv whose bin/python is the same script (so it reports the same version) and logs to
# DIR/calls.log; anything else ("-m pip ...") is only logged.
FAKE_PYTHON = """#!/bin/sh
version=VERSION
case "$1" in
  -c) echo "$version" ;;
  -m)
    if [ "$2" = venv ]; then
      mkdir -p "$3/bin" && cp "$0" "$3/bin/python" && echo "venv $version" >> "$3/calls.log"
    else
      shift; echo "$*" >> "$(dirname "$0")/../calls.log"
    fi ;;
esac
"""

# What a pyenv shim says for a version that is installed but not selected: nothing on stdout.
MISSING_PYTHON = """#!/bin/sh
echo "pyenv: $(basename "$0"): command not found" >&2
exit 127
"""

# The tools the Makefile's recipes call, linked into the otherwise empty PATH.
TOOLS = ("rm", "mkdir", "cp", "touch", "dirname", "cat")


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    """A copy of the files the Makefile's venv rule reads."""
    for name in ("Makefile", "pyproject.toml", "constraints.txt"):
        shutil.copy2(ROOT / name, tmp_path / name)
    (tmp_path / "bin").mkdir()
    for tool in TOOLS:
        found = shutil.which(tool)
        assert found is not None, tool
        (tmp_path / "bin" / tool).symlink_to(found)
    return tmp_path


def fake_python(project: Path, name: str, version: str | None) -> Path:
    """`bin/NAME` reporting `version`; None makes it a pyenv-style shim that does not run."""
    path = project / "bin" / name
    path.write_text(MISSING_PYTHON if version is None else FAKE_PYTHON.replace("VERSION", version))
    path.chmod(0o755)
    return path


def make(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": str(project / "bin"), "HOME": str(project)}
    assert MAKE is not None
    return subprocess.run(
        [MAKE, "--no-print-directory", "-C", str(project), *args],
        env=env, capture_output=True, text=True, timeout=60,
    )


def chosen(project: Path, *args: str) -> str:
    result = make(project, "which-python", *args)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


# -- which interpreter -------------------------------------------------------------------------


def test_prefers_python311_over_later_candidates(project: Path) -> None:
    for name, version in zip(CANDIDATES, ("3.11", "3.12", "3.13", "3.13")):
        fake_python(project, name, version)
    assert chosen(project) == "python3.11 (Python 3.11)"


def test_skips_missing_and_too_old_candidates_in_order(project: Path) -> None:
    fake_python(project, "python3.11", None)  # pyenv shim for an inactive version
    fake_python(project, "python3.12", "3.10")  # a name that lies about its version
    # python3.13 is not on PATH at all
    fake_python(project, "python3", "3.12")
    assert chosen(project) == "python3 (Python 3.12)"


def test_takes_python3_only_when_it_is_new_enough(project: Path) -> None:
    fake_python(project, "python3", "3.13")
    assert chosen(project) == "python3 (Python 3.13)"


@pytest.mark.parametrize("version", ["3.9", "3.10", "2.7", "garbage", ""])
def test_rejects_versions_older_than_311(project: Path, version: str) -> None:
    fake_python(project, "python3", version)
    result = make(project, "which-python")
    assert result.returncode != 0
    assert "No Python 3.11 or newer found" in result.stderr


def test_accepts_later_versions(project: Path) -> None:
    fake_python(project, "python3", "3.20")
    assert chosen(project) == "python3 (Python 3.20)"
    fake_python(project, "python3", "4.0")
    assert chosen(project) == "python3 (Python 4.0)"


def test_error_names_every_candidate_and_how_to_get_one(project: Path) -> None:
    fake_python(project, "python3.12", None)
    fake_python(project, "python3", "3.9")
    result = make(project, "which-python")
    assert result.returncode != 0
    message = result.stderr
    assert (
        "Tried: python3.11 (unavailable) python3.12 (unavailable) python3.13 (unavailable) python3 (3.9)"
        in message
    )
    assert "apt-get install python3.11" in message
    assert "pyenv install 3.11" in message
    assert "make PYTHON=" in message


def test_python_override_wins_and_is_checked(project: Path) -> None:
    fake_python(project, "python3.11", "3.11")
    custom = fake_python(project, "mypython", "3.13")
    assert chosen(project, f"PYTHON={custom}") == f"{custom} (Python 3.13)"
    old = fake_python(project, "oldpython", "3.8")
    result = make(project, "which-python", f"PYTHON={old}")
    assert result.returncode != 0
    assert f"Tried: {old} (3.8)" in result.stderr


# -- building and re-using .venv -----------------------------------------------------------------


def pip_calls(project: Path) -> list[str]:
    log = project / ".venv" / "calls.log"
    return [line for line in log.read_text().splitlines() if line.startswith("pip ")] if log.exists() else []


def test_venv_is_built_by_the_chosen_python_and_installs_from_the_constraints(project: Path) -> None:
    fake_python(project, "python3.11", None)
    fake_python(project, "python3.12", "3.12")
    result = make(project, "venv")
    assert result.returncode == 0, result.stderr
    assert "Creating .venv with python3.12 (Python 3.12)" in result.stdout
    assert (project / ".venv" / "calls.log").read_text().splitlines()[0] == "venv 3.12"
    calls = pip_calls(project)
    assert calls, "nothing was installed"
    assert all("-c constraints.txt" in call for call in calls), calls
    assert any(call.endswith("-e .[test,spark]") for call in calls), calls
    assert (project / ".venv" / ".installed").is_file()


def test_a_sound_venv_is_reused(project: Path) -> None:
    fake_python(project, "python3.11", "3.11")
    assert make(project, "venv").returncode == 0
    installs = len(pip_calls(project))
    result = make(project, "venv")
    assert result.returncode == 0, result.stderr
    assert len(pip_calls(project)) == installs
    assert "Rebuilding" not in result.stdout


@pytest.mark.parametrize("changed", ["constraints.txt", "pyproject.toml"])
def test_changing_the_pins_or_the_project_reinstalls(project: Path, changed: str) -> None:
    fake_python(project, "python3.11", "3.11")
    assert make(project, "venv").returncode == 0
    installs = len(pip_calls(project))
    stamp = (project / ".venv" / ".installed").stat().st_mtime
    os.utime(project / changed, (stamp + 10, stamp + 10))
    result = make(project, "venv")
    assert result.returncode == 0, result.stderr
    assert len(pip_calls(project)) > installs
    assert "Rebuilding" not in result.stdout  # the interpreter is fine: reinstall, not rebuild


def test_a_venv_built_by_an_old_python_is_rebuilt(project: Path) -> None:
    fake_python(project, "python3.11", "3.11")
    (project / ".venv" / "bin").mkdir(parents=True)
    old = project / ".venv" / "bin" / "python"
    old.write_text(FAKE_PYTHON.replace("VERSION", "3.10"))
    old.chmod(0o755)
    (project / ".venv" / ".installed").touch()  # looks installed and up to date
    result = make(project, "venv")
    assert result.returncode == 0, result.stderr
    assert "Rebuilding .venv: it runs Python 3.10, older than 3.11" in result.stdout
    assert (project / ".venv" / "calls.log").read_text().splitlines()[0] == "venv 3.11"
    assert pip_calls(project)


def test_a_venv_whose_interpreter_is_gone_is_rebuilt(project: Path) -> None:
    fake_python(project, "python3.11", "3.11")
    (project / ".venv" / "bin").mkdir(parents=True)
    (project / ".venv" / "bin" / "python").symlink_to(project / "removed" / "python3.11")
    (project / ".venv" / ".installed").touch()
    result = make(project, "venv")
    assert result.returncode == 0, result.stderr
    assert "Rebuilding .venv: its interpreter .venv/bin/python does not run" in result.stdout
    assert (project / ".venv" / "bin" / "python").read_text().startswith("#!/bin/sh")
    assert pip_calls(project)


def test_an_explicit_python_of_another_version_rebuilds_the_venv(project: Path) -> None:
    fake_python(project, "python3.11", "3.11")
    assert make(project, "venv").returncode == 0
    newer = fake_python(project, "python3.13", "3.13")
    result = make(project, "venv", f"PYTHON={newer}")
    assert result.returncode == 0, result.stderr
    assert f"it runs Python 3.11 but PYTHON={newer} is Python 3.13" in result.stdout
    assert (project / ".venv" / "calls.log").read_text().splitlines()[0] == "venv 3.13"


def test_no_python_means_no_venv_and_a_clear_error(project: Path) -> None:
    fake_python(project, "python3", "3.8")
    result = make(project, "venv")
    assert result.returncode != 0
    assert "No Python 3.11 or newer found" in result.stderr
    assert not (project / ".venv").exists()


# -- targets that need the venv -------------------------------------------------------------------


@pytest.mark.parametrize("target", ["java", "demo", "kafka", "spark-jars", "lint", "unit", "integration"])
def test_targets_that_run_venv_tools_depend_on_the_venv(project: Path, target: str) -> None:
    """On a fresh clone `.venv/bin/...` does not exist until the venv rule has run."""
    fake_python(project, "python3.11", "3.11")
    result = make(project, "-n", target)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    # The venv rule's recipe comes first and ends by touching its stamp; the target's own tools after.
    assert any("-m venv .venv" in line for line in lines), result.stdout
    installed = next(i for i, line in enumerate(lines) if "touch .venv/.installed" in line)
    assert any(".venv/bin/" in line for line in lines[installed + 1:]), result.stdout


# -- the README's account of these commands --------------------------------------------------------


def readme_two_commands() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## The two commands", 1)[1]
    return section.split("\n## ", 1)[0]


def makefile_variable(name: str) -> str:
    text = (ROOT / "Makefile").read_text()
    match = re.search(rf"^{name} [:?]?= (.*)$", text, re.MULTILINE)
    assert match, name
    return match.group(1).strip()


def test_readme_names_only_targets_the_makefile_has() -> None:
    makefile = (ROOT / "Makefile").read_text()
    named = set(re.findall(r"`make ([a-z-]+)", readme_two_commands())) | set(
        re.findall(r"^make ([a-z-]+)", readme_two_commands(), re.MULTILINE)
    )
    assert {"demo", "test", "which-python", "constraints", "java"} <= named
    missing = [target for target in named if not re.search(rf"^{target}:", makefile, re.MULTILINE)]
    assert missing == []


def test_readme_states_the_makefiles_python_search_and_kafka_versions() -> None:
    section = readme_two_commands()
    candidates = makefile_variable("PYTHON_CANDIDATES").split()
    assert tuple(candidates) == CANDIDATES
    assert ", ".join(f"`{name}`" for name in candidates) in section.replace("\n", " ")
    assert f"Python {makefile_variable('PYTHON_MIN')} or newer" in section
    versions = makefile_variable("KAFKA_VERSIONS").split()
    assert f"real Kafka {' and '.join(versions)}" in section
    assert "constraints.txt" in section


def test_readme_and_ci_agree_on_the_ci_command() -> None:
    assert "`make test` is what CI runs (`.ci/run`)" in readme_two_commands().replace("\n", " ")
    assert re.search(r"^exec make test$", (ROOT / ".ci" / "run").read_text(), re.MULTILINE)


def test_readme_states_the_demos_time_limit() -> None:
    from proxy.demo import DEMO_TIMEOUT

    assert f"after {DEMO_TIMEOUT / 60:.0f} minutes at most" in readme_two_commands().replace("\n", " ")


# -- helm, for the chart checks ----------------------------------------------------------------------


def test_helm_target_without_go_says_so_and_succeeds(project: Path) -> None:
    """No `go` on PATH: nothing is built, the reason is printed, and `make unit` is not stopped."""
    result = make(project, "helm")
    assert result.returncode == 0, result.stderr
    assert "go is not installed" in result.stdout and "KSP_HELM" in result.stdout
    assert not (project / ".cache").exists()


@pytest.mark.parametrize("tool", ["helm", "promtool"])
def test_a_go_built_tools_target_skips_a_cached_binary(project: Path, tool: str) -> None:
    version = makefile_variable(f"{tool.upper()}_VERSION")
    cached = project / ".cache" / "kafka-share-proxy" / f"{tool}-{version}" / tool
    cached.parent.mkdir(parents=True)
    cached.write_text("#!/bin/sh\n")
    cached.chmod(0o755)
    result = make(project, tool)
    assert result.returncode == 0, result.stderr
    assert f"{tool} {version} cached at {cached}" in result.stdout


def test_promtool_target_without_go_says_so_and_fails(project: Path) -> None:
    """Asked for explicitly, promtool without `go` is an error (the tests it serves skip on their own)."""
    result = make(project, "promtool")
    assert result.returncode != 0
    assert "go is not installed" in result.stdout and "KSP_PROMTOOL" in result.stdout
    assert not (project / ".cache").exists()


def test_test_does_not_build_promtool(project: Path) -> None:
    """A cold build takes ~5.5 minutes on two cores: not in CI's budget (its tests skip without it)."""
    fake_python(project, "python3.11", "3.11")
    result = make(project, "-n", "test")
    assert result.returncode == 0, result.stderr
    assert "go install helm.sh/helm/v3/cmd/helm@" in result.stdout  # the dry run does reach the builds
    assert "prometheus/cmd/promtool" not in result.stdout


def test_unit_depends_on_helm(project: Path) -> None:
    fake_python(project, "python3.11", "3.11")
    result = make(project, "-n", "unit")
    assert result.returncode == 0, result.stderr
    assert "go install helm.sh/helm/v3/cmd/helm@" in result.stdout
