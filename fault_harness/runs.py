"""What the harness's light write tasks read of their own run.

A module of its own because both pipelines' write tasks need it (``pipeline``, ``upsert_pipeline``)
and the append pipeline's DAG file imports the upsert pipeline's: kept here, neither imports the other
back.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.sdk import get_current_context


def running_write(conn_id: str, table_names: list[str]) -> tuple[dt.datetime, int, int, list[Any]]:
    """What a light write task needs of its run: the hour, its epoch, the try, the tables loaded now."""
    from airflow.providers.apache.iceberg.hooks.iceberg import IcebergHook

    from airflow_provider_exactly_once.core.epochs import epoch_from_interval_start

    context = get_current_context()
    start = context["data_interval_start"]
    assert start is not None
    catalog = IcebergHook(conn_id).catalog
    tables = [catalog.load_table(name) for name in table_names]
    return start, epoch_from_interval_start(start), int(context["ti"].try_number), tables
