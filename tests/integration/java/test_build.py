"""`make java` on a fresh clone: the Maven build of the Java drivers, with a fake `mvn`.

The module's paths are pointed at a temporary directory, so the real integration/java/target is
never touched; the fake mvn (a shell script first on PATH) builds, fails or hangs on request.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from integration.java import build

FAKE_MVN = """#!/bin/sh
case "$FAKE_MVN" in
  fail) echo "[ERROR] No compiler is provided in this environment." ; exit 1 ;;
  hang) exec sleep 30 ;;
esac
for arg in "$@"; do
  case "$arg" in -Dmdep.outputFile=*) out="${arg#-Dmdep.outputFile=}" ;; esac
done
mkdir -p target/classes && echo "$PWD/fake-kafka-clients.jar" > "$out" && touch fake-kafka-clients.jar
echo "mvn $*" >> mvn.log
"""


@pytest.fixture()
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh-clone layout: pom.xml and one source, no target/."""
    here = tmp_path / "java"
    (here / "src" / "main" / "java").mkdir(parents=True)
    (here / "pom.xml").write_text("<project/>")
    (here / "src" / "main" / "java" / "Main.java").write_text("class Main {}")
    target = here / "target"
    monkeypatch.setattr(build, "HERE", here)
    monkeypatch.setattr(build, "TARGET", target)
    monkeypatch.setattr(build, "CLASSES", target / "classes")
    monkeypatch.setattr(build, "CLASSPATH_FILE", target / "classpath.txt")
    monkeypatch.setattr(build, "STAMP", target / ".built")
    tools = tmp_path / "bin"
    tools.mkdir()
    mvn = tools / "mvn"
    mvn.write_text(FAKE_MVN)
    mvn.chmod(0o755)
    javac = tools / "javac"
    javac.write_text("#!/bin/sh\n")
    javac.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("FAKE_MVN", raising=False)
    return here


def test_a_fresh_clone_builds_then_is_up_to_date(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert not build.is_up_to_date()
    assert build.main() == 0
    out = capsys.readouterr().out
    assert "building the Java drivers with Maven" in out
    assert "java drivers built" in out
    assert build.is_up_to_date()
    assert build.main() == 0
    assert "java drivers up to date" in capsys.readouterr().out
    assert len((project / "mvn.log").read_text().splitlines()) == 1  # the second run did not call mvn


def test_an_edited_source_rebuilds(project: Path) -> None:
    build.build()
    later = time.time() + 10
    os.utime(project / "src" / "main" / "java" / "Main.java", (later, later))
    assert not build.is_up_to_date()
    build.build()
    assert len((project / "mvn.log").read_text().splitlines()) == 2


def test_a_failing_build_shows_mavens_output(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_MVN", "fail")
    with pytest.raises(build.JavaDriverError, match="No compiler is provided"):
        build.build()
    assert not build.is_up_to_date()


def test_a_hanging_build_gives_up_with_a_message(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_MVN", "hang")
    monkeypatch.setattr(build, "BUILD_TIMEOUT", 0.5)
    began = time.monotonic()
    with pytest.raises(build.JavaDriverError, match=r"did not finish building the Java drivers within 0 s"):
        build.build()
    assert time.monotonic() - began < 20


def test_missing_maven_or_jdk_is_named_with_how_to_install(
    project: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(build.JavaDriverError, match=r"apt-get install maven"):
        build.build()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    (tmp_path / "bin" / "javac").unlink()
    with pytest.raises(build.JavaDriverError, match=r"JDK 17\+.*apt-get install openjdk-17-jdk-headless"):
        build.build()
    jdk = tmp_path / "jdk"
    (jdk / "bin").mkdir(parents=True)
    (jdk / "bin" / "javac").write_text("")
    monkeypatch.setenv("JAVA_HOME", str(jdk))
    assert build.has_jdk()


def test_flags_become_dashed_pairs_and_collections_repeat_the_flag() -> None:
    arguments = build.flag_arguments(
        {
            "bootstrap": "127.0.0.1:9092",
            "command_config": "/tmp/admin.properties",
            "property": {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512"},
            "count": 3,
        }
    )
    assert arguments == [
        "--bootstrap", "127.0.0.1:9092",
        "--command-config", "/tmp/admin.properties",
        "--property", "security.protocol=SASL_SSL",
        "--property", "sasl.mechanism=SCRAM-SHA-512",
        "--count", "3",
    ]
    assert build.flag_arguments({"property": ["a=b", "c=d=e"]}) == ["--property", "a=b", "--property", "c=d=e"]
