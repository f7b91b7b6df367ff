"""PySpark data source `kraftlog` and example pipelines.

    import pipelines
    pipelines.register(spark)
    df = (spark.read.format("kraftlog")
          .option("kraftlog.bootstrap.servers", "http://127.0.0.1:8082")
          .option("subscribe", "clicks").load())

See docs/SPARK.md for the options, the schema and how to run on a cluster.
"""
from __future__ import annotations

__all__ = ["register", "FORMAT"]

FORMAT = "kraftlog"


def register(spark) -> None:
    """Register the `kraftlog` format with `spark` (idempotent)."""
    from pipelines.source import KraftlogDataSource

    spark.dataSource.register(KraftlogDataSource)
