"""Names both sides of the harness agree on, importable without Airflow (the harness process never
imports Airflow; the DAG files of the cluster do)."""

from __future__ import annotations

#: The fault point the light writer reaches after its files exist, before it returns them.
WRITE_POINT = "write.files_written"

#: The Spark connection of a ``writer="connect"`` pipeline: the stack's Spark Connect server (``stacks``).
SPARK_CONNECT_CONN_ID = "spark_connect_faults"


def hour_template(landing: str) -> str:
    """The checkpoint markers' and the input's directory of an hour under ``landing``."""
    return landing.rstrip("/") + "/{start:%Y/%m/%d/%H}"


def write_starts(landing: str) -> str:
    """Where ``slow_input`` leaves a file per Spark write it runs (named by the write id), beside the
    pipeline's landing directory ``landing``."""
    return landing.rstrip("/") + "-write-starts"
