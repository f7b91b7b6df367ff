"""Spark test fixtures: ONE SparkSession and ONE real broker per test session.

The broker is `kraftlog serve` (controller + broker, combined mode) on free ports in a temp
dir; the fixture waits for `/healthz` and for the node to accept a topic. Each test uses
its own topics (uuid names), so tests do not depend on each other.
"""
from __future__ import annotations

import os
import sys
import uuid

import pytest

from pipelines.client import Cluster
from deploy.local_node import LocalNode


@pytest.fixture(scope="session")
def broker_url(tmp_path_factory):
    node = LocalNode(str(tmp_path_factory.mktemp("kraftlog-spark")))
    node.start()
    try:
        yield node.url
    finally:
        node.stop()


@pytest.fixture(scope="session")
def spark():
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import pipelines

    session = (SparkSession.builder.master("local[2,4]").appName("kraftlog-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.driver.memory", "768m")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    pipelines.register(session)
    yield session
    session.stop()


@pytest.fixture
def cluster(broker_url):
    return Cluster([broker_url])


@pytest.fixture
def new_topic(cluster):
    """Factory: a fresh topic with `partitions` partitions, ready for produce/fetch."""

    def make(partitions: int = 1, configs: dict | None = None) -> str:
        name = "t-" + uuid.uuid4().hex[:10]
        cluster.create_topic(name, partitions=partitions, replication_factor=1, configs=configs)
        cluster.wait_for_topic(name, partitions)
        return name

    return make
