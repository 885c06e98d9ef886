"""Write, audit, publish (docs/design.md D23): each day's orders are committed to an audit branch,
checked there by SQL that DuckDB runs over the day's rows, and published to ``main`` only when every
check passes. A failed check leaves ``main`` untouched; reprocess the day once the input is fixed, or
drop it with ``eo-sink reject audited_orders <epoch>``.

Settings come from the environment, as in the other examples, so the file imports without side
effects anywhere: ``EO_EXAMPLES_ORDERS_LANDING`` (the landing root, one Parquet directory per day;
default ``$AIRFLOW_HOME/exactly_once_examples/landing/orders``), ``EO_EXAMPLES_ICEBERG_CONN_ID``,
``EO_EXAMPLES_SPARK_CONN_ID`` and ``EO_EXAMPLES_META_CONN_ID``."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

from airflow.sdk import DAG

from airflow_provider_exactly_once import (
    FilesInput,
    IcebergSinkConfig,
    MetaStoreCheckpoint,
    SparkWrite,
    SqlCheck,
    exactly_once_epoch,
)

_HOME = Path(os.environ.get("AIRFLOW_HOME", "~/airflow")).expanduser()
LANDING = os.environ.get("EO_EXAMPLES_ORDERS_LANDING", str(_HOME / "exactly_once_examples" / "landing" / "orders"))

with DAG(
    "audited_orders",
    schedule="@daily",
    start_date=dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
    catchup=False,
    max_active_runs=1,
):
    exactly_once_epoch(
        SparkWrite(
            FilesInput(path=LANDING.rstrip("/") + "/{{ ds }}", format="parquet"),
            conn_id=os.environ.get("EO_EXAMPLES_SPARK_CONN_ID", "spark_default"),
        ),
        sink=IcebergSinkConfig(
            "audited_orders",
            "shop.orders",
            iceberg_conn_id=os.environ.get("EO_EXAMPLES_ICEBERG_CONN_ID", "iceberg_default"),
        ),
        checkpoint=MetaStoreCheckpoint(),
        meta_conn_id=os.environ.get("EO_EXAMPLES_META_CONN_ID"),
        audit=[
            SqlCheck(
                name="amounts_positive",
                sql="select order_id, amount from epoch_rows where amount <= 0",
                message="orders with a non-positive amount",
            ),
            SqlCheck(
                name="no_duplicate_orders",
                sql="select order_id, count(*) from orders group by order_id having count(*) > 1",
                message="an order id appears twice in the table as publishing would leave it",
            ),
        ],
    )
