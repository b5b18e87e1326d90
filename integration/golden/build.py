"""Build (once) and run the golden Java driver; the build is cached under target/."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
TARGET = HERE / "target"
STAMP = TARGET / "golden.stamp"
SOURCES = [HERE / "pom.xml", *sorted((HERE / "src").rglob("*.java"))]


class GoldenBuildError(RuntimeError):
    pass


def _up_to_date() -> bool:
    return STAMP.exists() and all(source.stat().st_mtime <= STAMP.stat().st_mtime for source in SOURCES)


def build() -> Path:
    """Compile the driver and copy its dependencies; offline first, online if the cache lacks something."""
    if _up_to_date():
        return TARGET
    if shutil.which("mvn") is None or shutil.which("java") is None:
        raise GoldenBuildError("mvn and java are needed for the golden tests")
    goals = ["package", "dependency:copy-dependencies", "-DoutputDirectory=target/lib"]
    for mode in (["-o"], []):
        result = subprocess.run(["mvn", "-q", "-B", *mode, *goals], cwd=HERE, capture_output=True, text=True)
        if result.returncode == 0:
            STAMP.touch()
            return TARGET
    raise GoldenBuildError(f"mvn failed:\n{result.stdout[-4000:]}\n{result.stderr[-2000:]}")


def run(*args: str) -> dict:
    """Run ``golden.Golden`` with ``args``; return its JSON output."""
    target = build()
    classpath = f"{target / 'classes'}:{target / 'lib' / '*'}"
    result = subprocess.run(["java", "-cp", classpath, "golden.Golden", *args], capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise GoldenBuildError(f"golden driver failed ({args[:2]}):\n{result.stderr[-4000:]}")
    return json.loads(result.stdout)


if __name__ == "__main__":
    print(build())
