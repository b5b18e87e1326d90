"""spark/session.py: the code zip executors import from, and the Ivy settings it points Spark at."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
import zipfile
from pathlib import Path

from spark import session


def test_code_zip_holds_codec_spark_and_the_schemas(tmp_path: Path) -> None:
    names = zipfile.ZipFile(session.code_zip(tmp_path)).namelist()
    assert {"codec/share_events.py", "codec/schemas/ShareSnapshotValue.json", "spark/decode.py",
            "spark/ivysettings.xml"} <= set(names)
    assert not [name for name in names if "__pycache__" in name or name.startswith("proxy/")]


def test_codec_decodes_from_the_zip_alone(tmp_path: Path) -> None:
    """What an executor does: import codec (schemas included) from the zip, not from a checkout."""
    archive = session.code_zip(tmp_path)
    script = ("import sys; sys.path.insert(0, sys.argv[1]); import codec.share_state as s, spark.decode; "
              "assert s.__file__.startswith(sys.argv[1]), s.__file__; print('ok')")
    result = subprocess.run([sys.executable, "-c", script, str(archive)], capture_output=True, text=True,
                            cwd=tmp_path, timeout=60)
    assert result.stdout.strip() == "ok", result.stderr


def test_the_shipped_zip_is_removed_when_the_process_exits(tmp_path: Path) -> None:
    script = ("import sys; from spark import session; archive = session.shipped_code_zip(); "
              "assert archive.is_file(); print(archive)")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(Path(session.ROOT))})
    assert result.returncode == 0, result.stderr
    archive = Path(result.stdout.strip())
    assert archive.parent.parent == tmp_path and archive.name == "ksp-spark-code.zip"
    assert not archive.parent.exists()
    assert list(tmp_path.iterdir()) == []


def test_ivy_settings_resolve_from_maven_central_only() -> None:
    root = ElementTree.parse(session.IVY_SETTINGS).getroot()
    resolvers = root.find("resolvers")
    assert resolvers is not None
    roots = [resolver.get("root") for resolver in resolvers.iter() if resolver.get("root")]
    assert roots == ["https://repo1.maven.org/maven2/"]
    assert session.KAFKA_PACKAGE == "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0"


def test_local_masters_get_a_few_shuffle_partitions_per_core_clusters_keep_their_default() -> None:
    assert session.shuffle_partitions("local[2]") == 4
    assert session.shuffle_partitions("local") == 2
    assert session.shuffle_partitions("local[*]") == max(2, 2 * (os.cpu_count() or 1))
    assert session.shuffle_partitions("spark://host:7077") is None
    assert session.shuffle_partitions("yarn") is None
