"""Apache Kafka broker jars: fetched from Maven Central with `mvn`, cached outside the repo.

Layout of the cache (one directory per Kafka version)::

    $KSP_KAFKA_CACHE/kafka-<version>/libs/*.jar      the broker's runtime classpath
    $KSP_KAFKA_CACHE/kafka-<version>/libs/.complete  written last; its presence means "done"
    $KSP_KAFKA_CACHE/kafka-<version>/formatted-*/    pre-formatted KRaft storage templates

`KSP_KAFKA_CACHE` defaults to `$XDG_CACHE_HOME/kafka-share-proxy` (else `~/.cache/kafka-share-proxy`).
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from importlib import resources
from pathlib import Path

from proxy.localkafka.errors import LocalKafkaError

COMPLETE_MARKER = ".complete"
_VERSION_PATTERN = re.compile(r"^\d+\.\d+\.\d+$")


def cache_root(environ: Mapping[str, str] | None = None) -> Path:
    """The directory that holds every cached Kafka version."""
    env = os.environ if environ is None else environ
    if env.get("KSP_KAFKA_CACHE"):
        return Path(env["KSP_KAFKA_CACHE"]).expanduser()
    xdg = env.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path(env.get("HOME", "~")).expanduser() / ".cache"
    return base / "kafka-share-proxy"


def version_dir(version: str, environ: Mapping[str, str] | None = None) -> Path:
    return cache_root(environ) / f"kafka-{check_version(version)}"


def lib_dir(version: str, environ: Mapping[str, str] | None = None) -> Path:
    return version_dir(version, environ) / "libs"


def check_version(version: str) -> str:
    """Accept only plain release versions (they end up in paths and Maven arguments)."""
    if not _VERSION_PATTERN.match(version):
        raise LocalKafkaError(f"not a Kafka release version: {version!r} (expected e.g. 4.4.0)")
    return version


def major_version(version: str) -> int:
    return int(check_version(version).split(".", 1)[0])


def logging_flavour(version: str) -> str:
    """Which slf4j binding the broker gets: Kafka 4 logs through log4j2, Kafka 3 through log4j 1."""
    return "log4j2" if major_version(version) >= 4 else "reload4j"


def is_cached(libs: Path) -> bool:
    """True when a previous fetch into `libs` ran to completion."""
    return (libs / COMPLETE_MARKER).is_file() and any(libs.glob("kafka_2.13-*.jar"))


def classpath(libs: Path) -> str:
    """A `java -cp` argument with every jar in `libs` (wildcards are expanded by java itself)."""
    return str(libs / "*")


def package_file(name: str) -> Path:
    """A data file shipped inside the proxy.localkafka package (pom.xml, log configs)."""
    return Path(str(resources.files("proxy.localkafka").joinpath(name)))


def maven_command(pom: Path, version: str, output_dir: Path) -> list[str]:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise LocalKafkaError("`mvn` (Apache Maven) is not on PATH; it is needed to fetch the Kafka jars")
    return [
        mvn,
        "-q",
        "-B",
        "-f",
        str(pom),
        f"-Dkafka.version={version}",
        f"-Dkafka.logging={logging_flavour(version)}",
        "dependency:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={output_dir}",
    ]


@contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """Serialise work on one cache entry (a fetch, a format) across processes: make and pytest may race."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def fetch_kafka(version: str, environ: Mapping[str, str] | None = None) -> Path:
    """Return the lib directory for `version`, downloading it with Maven unless already cached."""
    libs = lib_dir(version, environ)
    if is_cached(libs):
        return libs
    home = libs.parent
    with _exclusive(home.parent / f".kafka-{version}.lock"):
        if is_cached(libs):  # another process finished the download while we waited
            return libs
        home.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="fetch-", dir=home) as scratch:
            # mvn runs on a private copy of the pom: the installed package may be read-only.
            pom = Path(scratch) / "pom.xml"
            shutil.copyfile(package_file("pom.xml"), pom)
            staging = Path(scratch) / "libs"
            result = subprocess.run(
                maven_command(pom, version, staging),
                cwd=scratch,
                capture_output=True,
                text=True,
            )
            if result.returncode != 0 or not any(staging.glob("kafka_2.13-*.jar")):
                output = (result.stdout + result.stderr).strip()
                raise LocalKafkaError(
                    f"mvn could not fetch Apache Kafka {version} (exit {result.returncode}):\n{output[-4000:]}"
                )
            (staging / COMPLETE_MARKER).write_text(version + "\n")
            if libs.exists():  # a partial directory from an interrupted older layout
                shutil.rmtree(libs)
            staging.rename(libs)
    return libs
