"""Names both sides of the harness agree on, importable without Airflow (the harness process never
imports Airflow; the DAG files of the cluster do)."""

from __future__ import annotations

#: The fault point the light writer reaches after its files exist, before it returns them.
WRITE_POINT = "write.files_written"

#: The Spark connection of a ``writer="connect"`` pipeline: a ``spark_connect`` connection to a Spark
#: Connect server, defined by whoever started that server (the cluster only defines ``spark_default``).
SPARK_CONNECT_CONN_ID = "spark_connect_faults"


def hour_template(landing: str) -> str:
    """The checkpoint markers' and the input's directory of an hour under ``landing``."""
    return landing.rstrip("/") + "/{start:%Y/%m/%d/%H}"
