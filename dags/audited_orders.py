"""Write, audit, publish (docs/design.md D23): each day's orders are committed to an audit branch,
checked there by SQL that DuckDB runs over the day's rows, and published to ``main`` only when every
check passes. A failed check leaves ``main`` untouched; reprocess the day once the input is fixed, or
drop it with ``eo-sink reject audited_orders <epoch>``."""

from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG

from airflow_provider_exactly_once import (
    FilesInput,
    IcebergSinkConfig,
    MetaStoreCheckpoint,
    SparkWrite,
    SqlCheck,
    exactly_once_epoch,
)

with DAG(
    "audited_orders",
    schedule="@daily",
    start_date=dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
    catchup=False,
    max_active_runs=1,
):
    exactly_once_epoch(
        SparkWrite(FilesInput(path="/data/landing/orders/{{ ds }}", format="parquet")),
        sink=IcebergSinkConfig("audited_orders", "shop.orders"),
        checkpoint=MetaStoreCheckpoint(),
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
