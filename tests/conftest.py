"""Fixtures shared by test packages: one real local SparkSession for the whole test session
(starting one costs seconds; tests/trend and the event log system test both use it)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from scale0.trend.job import spark_session

    session = spark_session("local[2]", shuffle_partitions=2)
    try:
        yield session
    finally:
        session.stop()
