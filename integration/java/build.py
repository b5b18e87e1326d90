"""Build the Java integration drivers once (`make java`), and run them from tests.

`python -m integration.java.build` compiles src/ with Maven into target/classes and writes
the dependency classpath to target/classpath.txt; it does nothing when both are newer than
every source and the jars they name still exist.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TARGET = HERE / "target"
CLASSES = TARGET / "classes"
CLASSPATH_FILE = TARGET / "classpath.txt"
STAMP = TARGET / ".built"
MAIN_CLASS = "io.ksp.driver.Main"
# A first build downloads kafka-clients and Maven's plugins from Maven Central; later ones take seconds.
BUILD_TIMEOUT = 900.0


class JavaDriverError(RuntimeError):
    """Building or running a Java driver failed."""


def sources() -> list[Path]:
    return [HERE / "pom.xml", *sorted((HERE / "src").rglob("*.java"))]


def is_up_to_date() -> bool:
    if not (STAMP.is_file() and CLASSPATH_FILE.is_file() and CLASSES.is_dir()):
        return False
    built_at = STAMP.stat().st_mtime
    if any(source.stat().st_mtime > built_at for source in sources()):
        return False
    return all(Path(jar).is_file() for jar in CLASSPATH_FILE.read_text().strip().split(":") if jar)


def has_jdk() -> bool:
    """A Java compiler Maven can use: `javac` on PATH, or in $JAVA_HOME/bin."""
    java_home = os.environ.get("JAVA_HOME")
    return shutil.which("javac") is not None or bool(java_home and (Path(java_home) / "bin" / "javac").is_file())


def build(force: bool = False) -> Path:
    """Compile when needed; returns the target directory."""
    if not force and is_up_to_date():
        return TARGET
    if shutil.which("mvn") is None:
        raise JavaDriverError(
            "`mvn` (Apache Maven) is needed to build the Java drivers (Debian/Ubuntu: apt-get install maven)"
        )
    if not has_jdk():
        raise JavaDriverError(
            "a JDK 17+ (`javac` on PATH or in $JAVA_HOME/bin) is needed to build the Java drivers "
            "(Debian/Ubuntu: apt-get install openjdk-17-jdk-headless)"
        )
    command = [
        "mvn",
        "-q",
        "-B",
        "package",
        "dependency:build-classpath",
        f"-Dmdep.outputFile={CLASSPATH_FILE}",
    ]
    try:
        result = subprocess.run(command, cwd=HERE, capture_output=True, text=True, timeout=BUILD_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise JavaDriverError(
            f"mvn did not finish building the Java drivers within {BUILD_TIMEOUT:.0f} s; a first build "
            f"downloads from Maven Central, so check the network (`mvn -B package` in {HERE} shows progress)"
        ) from None
    if result.returncode != 0:
        raise JavaDriverError(f"mvn failed (exit {result.returncode}):\n{(result.stdout + result.stderr)[-4000:]}")
    STAMP.touch()
    return TARGET


def classpath() -> str:
    return f"{CLASSES}:{CLASSPATH_FILE.read_text().strip()}"


def flag_arguments(flags: dict[str, object]) -> list[str]:
    """`--name value` pairs (underscores become dashes). A list, tuple or dict value repeats the
    flag: `property={"security.protocol": "SASL_SSL"}` or `property=["a=b"]` gives `--property a=b`."""
    arguments: list[str] = []
    for name, value in flags.items():
        flag = f"--{name.replace('_', '-')}"
        if isinstance(value, dict):
            items: list[object] = [f"{key}={item}" for key, item in value.items()]
        elif isinstance(value, (list, tuple)):
            items = list(value)
        else:
            items = [value]
        for item in items:
            arguments += [flag, str(item)]
    return arguments


def driver_command(subcommand: str, **flags: object) -> list[str]:
    """`java ... io.ksp.driver.Main <subcommand> --flag value ...` (see `flag_arguments`).

    Every subcommand that builds a client takes `command_config=<properties file>` and repeated
    `property=...` client settings, applied last (e.g. `property=kafka.java_properties("alice")`).
    """
    build()
    java = shutil.which("java")
    if java is None:
        raise JavaDriverError("`java` (JDK 17+) is not on PATH")
    arguments = flag_arguments(flags)
    return [java, "-XX:TieredStopAtLevel=1", "-cp", classpath(), MAIN_CLASS, subcommand, *arguments]


def run_driver(subcommand: str, timeout: float = 180.0, **flags: object) -> dict[str, Any]:
    """Run a driver subcommand and return its JSON summary; raises when it fails."""
    result = subprocess.run(driver_command(subcommand, **flags), capture_output=True, text=True, timeout=timeout)
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode != 0 or not lines:
        raise JavaDriverError(
            f"java driver {subcommand} failed (exit {result.returncode}):\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
        )
    return json.loads(lines[-1])


def main() -> int:
    try:
        already = is_up_to_date()
        if not already:
            print(f"building the Java drivers with Maven in {HERE} (a first build downloads from Maven Central)",
                  flush=True)
        build()
    except JavaDriverError as error:
        print(error, file=sys.stderr)
        return 1
    print(f"java drivers {'up to date' if already else 'built'}: {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
