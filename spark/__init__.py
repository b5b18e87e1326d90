"""PySpark jobs over the proxy's event log and state topic (docs/spark.md).

``share-proxy spark audit`` writes audit tables and a report; ``share-proxy spark dead-letters``
exports archived records with their payloads. This package imports the codec, never the proxy
(import-linter contract), and pyspark only inside the modules that need it, so that
``share-proxy spark --help`` works without the ``spark`` extra installed.
"""
