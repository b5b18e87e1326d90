"""The SparkSession the jobs run in: local[*] by default, any master URL, the Kafka connector from
Maven Central through ``spark/ivysettings.xml`` (docs/spark.md)."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

from pyspark.sql import SparkSession

SPARK_VERSION = "4.2.0"
#: The Structured Streaming Kafka source/sink (pulls kafka-clients and the rest from Maven Central).
KAFKA_PACKAGE = f"org.apache.spark:spark-sql-kafka-0-10_2.13:{SPARK_VERSION}"
IVY_SETTINGS = Path(__file__).with_name("ivysettings.xml")
#: Where Ivy keeps the resolved jars, so a second run (and the tests) never download.
IVY_HOME = Path(os.environ.get("KSP_SPARK_IVY_HOME", Path.home() / ".cache" / "kafka-share-proxy" / "ivy"))
DEFAULT_MASTER = "local[*]"
ROOT = Path(__file__).resolve().parents[1]
#: The packages executors import to decode (shipped as a py-files zip).
SHIPPED_PACKAGES = ("codec", "spark")


def code_zip(directory: Path) -> Path:
    """A zip of the packages executors need (codec + spark, schemas included), for ``addPyFile``."""
    target = directory / "ksp-spark-code.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for package in SHIPPED_PACKAGES:
            for path in sorted((ROOT / package).rglob("*")):
                if path.is_file() and "__pycache__" not in path.parts and path.suffix in (".py", ".json", ".xml"):
                    archive.write(path, path.relative_to(ROOT).as_posix())
    return target


def shipped_code_zip() -> Path:
    """:func:`code_zip` in a directory of its own that is removed when the process exits: Spark serves
    an added file from its path to executors that fetch it later, so it stays for the job's life,
    and no longer (each job used to leave one in the temporary directory)."""
    directory = Path(tempfile.mkdtemp(prefix="ksp-spark-"))
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    return code_zip(directory)


def shuffle_partitions(master: str | None) -> int | None:
    """Shuffle partitions for a local master: a few per core (Spark's 200 default means 200 tiny tasks per
    shuffle on a laptop); None (Spark's default, tuned by the cluster) for any other master."""
    master = master or DEFAULT_MASTER
    if not master.startswith("local"):
        return None
    cores = master[len("local["):].split(",")[0].rstrip("]") if master.startswith("local[") else "1"
    count = os.cpu_count() or 1 if cores == "*" else int(cores)
    return max(2, 2 * count)


def builder(app_name: str, master: str | None = None, *, kafka: bool = True,
            shuffle_partitions: int | None = None) -> SparkSession.Builder:
    """A configured builder: quiet UI-less local runs, Ivy through our settings when ``kafka``."""
    # Python workers must run this interpreter (it has pyarrow and the codec's dependencies), not `python3`.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    spark_builder = (SparkSession.builder.appName(app_name).master(master or DEFAULT_MASTER)
                     .config("spark.ui.enabled", "false")
                     .config("spark.sql.session.timeZone", "UTC")
                     .config("spark.sql.execution.arrow.pyspark.enabled", "true"))
    if shuffle_partitions is not None:
        spark_builder = spark_builder.config("spark.sql.shuffle.partitions", str(shuffle_partitions))
    if kafka:
        spark_builder = (spark_builder.config("spark.jars.packages", KAFKA_PACKAGE)
                         .config("spark.jars.ivySettings", str(IVY_SETTINGS))
                         .config("spark.jars.ivy", str(IVY_HOME)))
    return spark_builder


def start(app_name: str, master: str | None = None, *, kafka: bool = True, ship_code: bool = True,
          shuffle_partitions: int | None = None) -> SparkSession:
    """Start (or join) a session; ships codec + spark to executors unless ``ship_code`` is False."""
    session = builder(app_name, master, kafka=kafka, shuffle_partitions=shuffle_partitions).getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    if ship_code:
        session.sparkContext.addPyFile(str(shipped_code_zip()))
    return session


def fetch_jars() -> int:
    """Resolve the Kafka connector's jars into the Ivy cache (a session that runs nothing)."""
    session = start("ksp-fetch-jars", "local[1]", ship_code=False)
    jars = session.sparkContext.getConf().get("spark.jars", "")
    session.stop()
    names = [jar.rsplit("/", 1)[-1] for jar in jars.split(",") if jar]
    print(f"{len(names)} jars resolved into {IVY_HOME / 'jars'}: {' '.join(names)}")
    return 0 if names else 1
