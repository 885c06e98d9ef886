"""A real ``airflow api-server`` serving the sink-state view, over a real meta store and Iceberg catalog.

One API server per session (starting one costs seconds): a private AIRFLOW_HOME with its own SQLite
metadata DB, the SimpleAuthManager with a viewer, a user and an admin (passwords from a file, as
``[core] simple_auth_manager_passwords_file`` reads them) and two users granted one DAG only each (through
``auth_manager.PerDagAuthManager``, a SimpleAuthManager that also decides per DAG): ``limited``, and
``partner``, whose DAG shares a sink with another DAG; the plugin loaded from the package's
``airflow.plugins`` entry point, and the meta store and catalog reached through
``AIRFLOW_CONN_*`` connections exactly as a deployment would. Airflow's configuration is set in the
child's environment only, so this process's Airflow (other suites') is never touched.

The epochs are made by a real coordinator on real Parquet files, one per state the view shows;
each action test owns its epoch, so the tests do not depend on each other's order.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest

from airflow_provider_exactly_once.checkpoints.config import MetaStoreCheckpoint, SnapshotRangeCheckpoint
from airflow_provider_exactly_once.core.epochs import Actor, ActorKind, CheckpointStatus, acting, run_failure
from airflow_provider_exactly_once.core.ports import CommitMark
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.runtime.run_epochs import reserved_range
from airflow_provider_exactly_once.sinks.config import IcebergSinkConfig
from tests.operations.helpers import age_rows
from tests.support.builders import (
    OPEN_RANGE,
    empty_write,
    free_port,
    make_pre_commit,
    plant_stored_write,
    register_file_sink_with_root,
)
from tests.support.pipeline import Pipeline

# This process imports Airflow too (the plugin's declarations): tests/conftest.py points it at a
# private AIRFLOW_HOME first, so a run of this suite alone never touches ~/airflow.

TABLE = "orders"
OTHER_TABLE = "clicks"
SINK = "orders"  # the Iceberg sink the tests act on
OTHER_SINK = "clicks"  # a second sink, for the filter
DAG_ID = "eo_orders_hourly"
OTHER_DAG_ID = "eo_clicks_hourly"
BASE = 1_767_225_600_000  # 2026-01-01T00:00Z in ms
HOUR = 3_600_000
USERS = {"viewer": "VIEWER", "user": "USER", "admin": "ADMIN", "limited": "USER", "partner": "USER"}
STARTUP_TIMEOUT_S = 120
REPO = Path(__file__).resolve().parents[3]

# The per-DAG world: a sink whose newest epochs belong to a DAG the limited user may not read.
LIMITED = "limited"
PAGED_SINK = "paged"
MINE_DAG = "eo_paged_mine"  # the only DAG the limited user may read (and edit)
THEIRS_DAG = "eo_paged_theirs"
THEIRS_EPOCHS = range(131, 251)  # the 120 newest epochs of PAGED_SINK
MINE_EPOCHS = range(1, 131)  # the 130 older ones
# Credentials planted where a careless deployment puts them: a file sink's root, its checkpoint path,
# an error text, an Iceberg catalog's URI. No answer, page or log line may ever show the password.
SECRET_SINK = "exports"
SECRET_DAG = "eo_exports"
SECRET_EPOCH = BASE
DEAD_SINK = "dead"  # an Iceberg sink whose catalog is down (a closed port)
# Issue 54: a sink two DAGs write (the reuse design.md D7 warns about), and a user granted one of them.
PARTNER = "partner"
SHARED_SINK = "events"
SHARED_TABLE = "events"
PARTNER_DAG = "eo_events_hourly"  # the one DAG the partner may read
ELSEWHERE_DAG = "eo_events_elsewhere"  # the other DAG writing the same sink
ELSEWHERE_TASK = "load_elsewhere"
#: The other DAG's runs that acted on the partner's epoch (first, late) and on its own (own).
ELSEWHERE_RUNS = ("manual__elsewhere-first", "manual__elsewhere-late", "manual__elsewhere-own")
PARTNER_RUN = "scheduled__events-1"
#: What the partner must never read, in any answer: the other DAG's id, task and runs.
ELSEWHERE_NAMES = (ELSEWHERE_DAG, ELSEWHERE_TASK, *ELSEWHERE_RUNS)
#: A sink whose one epoch is the newest of all, its write stored as persist stored one before it
#: refused positions that are no range: the first row of every listing, never readable.
BROKEN_SINK = "broken"
BROKEN_EPOCH = BASE + 100 * HOUR
#: OTHER_SINK's epoch whose first delivery was given up and whose second was committed.
REDELIVERED = BASE + 2 * HOUR
#: OTHER_SINK's committed epoch a newer run reprocessed, which the sink kept out (on_reprocess='keep'):
#: its row is unchanged but for the warning.
KEPT_OUT = BASE + HOUR
DEAD_EPOCH = BASE
# Issue 55: an incremental sink whose epochs went wrong, and runs that will never finish.
SILVER_SINK = "silver"
SILVER_TABLE = "silver"
SILVER_DAG = "eo_silver_orders"
SILVER_UPSTREAM = "bronze.orders"
#: The write task of the silver DAG's epoch group, and the error Spark gave it.
SILVER_WRITE = "exactly_once_silver.write"
CAST_OVERFLOW = 'SparkArithmeticException: [CAST_OVERFLOW] The value 1.0E32D of the type "DOUBLE" cannot be cast'
#: A sink whose Pending epochs' runs are quiet for hours but alive (a deferred sensor, a heartbeat).
LIVE_SINK = "live"
#: How long ago the killed run and the live runs' epochs were written (the threshold is an hour).
QUIET_HOURS = 3


class Silver:
    """The epochs of ``SILVER_SINK``, each reading its range of ``SILVER_UPSTREAM``."""

    COMMITTED = BASE + 10 * HOUR
    #: Its write failed on try 2 with Spark's CAST_OVERFLOW; its run's abort said so; ``AGAIN`` read
    #: its range again and was committed.
    ABORTED = BASE + 11 * HOUR
    AGAIN = BASE + 12 * HOUR
    #: Reserved by a run killed hours ago (no row): Airflow still calls the run running.
    RESERVED = BASE + 13 * HOUR
    RUNS: ClassVar[dict[int, str]] = {
        COMMITTED: "scheduled__silver-1",
        ABORTED: "scheduled__silver-2",
        AGAIN: "scheduled__silver-3",
    }
    KILLED_RUN = "manual__silver-killed"


class Live:
    """``LIVE_SINK``'s Pending epochs, written hours ago by runs Airflow has alive."""

    DEFERRED = BASE + 20 * HOUR
    BEATING = BASE + 21 * HOUR
    RUNS: ClassVar[dict[int, str]] = {DEFERRED: "manual__live-deferred", BEATING: "manual__live-beating"}


class Shared:
    """The epochs of ``SHARED_SINK``."""

    #: The partner's DAG holds it now; the other DAG's first write was aborted there, its late one
    #: discarded with the warning that names that DAG.
    OWNED = BASE
    #: The other DAG's own.
    THEIRS = BASE + HOUR


#: Issue 58: an audited sink (write, audit, publish), its epochs at each stage of their audit.
AUDITED_SINK = "audited"
AUDITED_TABLE = "audited"
#: Planted in a failed check's message: shown as text, never as an element.
CHECK_MARKUP = "<img src=x onerror=alert(2) class=planted>"


class Audited:
    """The epochs of ``AUDITED_SINK``, by the stage of their audit; each written by ``DAG_ID``."""

    PUBLISHED = BASE  # its audit passed, then published: Committed, the audit kept as its record
    AUDITING = BASE + HOUR  # on its audit branch, its checks not run
    AUDITED = BASE + 2 * HOUR  # its audit passed, its publish not run
    FAILED = BASE + 3 * HOUR  # its audit failed: the page offers Reject, and it stays
    FAILED_API = BASE + 4 * HOUR  # its audit failed: rejected through the API
    FAILED_BROWSER = BASE + 5 * HOUR  # its audit failed: rejected through the browser
    #: The failed checks of the epochs whose audit failed.
    FAILED_CHECKS = (("no_null_ids", f"3 rows break the check {CHECK_MARKUP}"), ("fresh", "newest row 3 days old"))


class Epochs:
    """The epochs of ``SINK``, by the role each plays in the tests."""

    COMMITTED = BASE
    TO_COMMIT = BASE + 1 * HOUR  # Pending, checkpoint COMPLETED: the API's retry-commit test
    ABORT_REFUSED = BASE + 2 * HOUR  # Pending, checkpoint COMPLETED: abort must be refused (409)
    WAITING_BROWSER = BASE + 3 * HOUR  # Pending, checkpoint PENDING: aborted through the browser
    ABORTED = BASE + 4 * HOUR  # Aborted, its clean-up never ran: the clean-up action
    CHECKPOINT_FAILED = BASE + 5 * HOUR  # Pending, checkpoint FAILED, with a last error
    WAITING_API = BASE + 6 * HOUR  # Pending, checkpoint PENDING: aborted through the API
    NO_DAG = BASE + 7 * HOUR  # Pending, written outside any DAG run


@dataclass
class UiWorld:
    tmp: Path
    pipeline: Pipeline
    catalog_conn_id: str
    writes: dict[int, PreCommit] = field(default_factory=dict)
    #: The writes of ``AUDITED_SINK``'s epochs.
    audited_writes: dict[int, PreCommit] = field(default_factory=dict)
    password: str = field(default_factory=lambda: f"Planted-{uuid.uuid4().hex}")
    dead_conn_id: str = field(default_factory=lambda: f"eo_ui_dead_{uuid.uuid4().hex[:8]}")
    dead_port: int = 0
    #: The reprocessed epoch of OTHER_SINK: the write its revision replaced, and the one it holds now.
    replaced: str = ""
    replacing: str = ""

    @property
    def secret_root(self) -> str:
        return f"s3://AKIAEXAMPLE:{self.password}@bucket/exports"

    @property
    def dead_catalog_uri(self) -> str:
        return f"postgresql+psycopg2://eo:{self.password}@127.0.0.1:{self.dead_port}/catalog"

    @property
    def table(self) -> str:
        return f"{self.pipeline.namespace}.{TABLE}"

    def snapshots_with_marker(self, epoch: int) -> list[str]:
        """Ids of the table's snapshots carrying this epoch's marker, read fresh from the catalog."""
        table = self.pipeline.catalog.load_table(self.table)
        return [
            str(s.snapshot_id)
            for s in table.snapshots()
            if s.summary is not None
            and s.summary.additional_properties.get("exactly-once.sink-id") == SINK
            and s.summary.additional_properties.get("exactly-once.epoch") == str(epoch)
        ]

    def status(self, epoch: int, sink_id: str = SINK) -> str:
        row = self.pipeline.store.get(sink_id, epoch)
        assert row is not None
        return str(row.status.value)


def _build_world(tmp: Path) -> UiWorld:
    suffix = uuid.uuid4().hex[:8]
    catalog_conn_id = f"eo_ui_catalog_{suffix}"
    warehouse = tmp / "warehouse"
    warehouse.mkdir()
    pipeline = Pipeline(
        meta_url=f"sqlite:///{tmp / 'meta.db'}",
        catalog_url=f"sqlite:///{tmp / 'catalog.db'}",
        warehouse=warehouse,
        catalog_name=catalog_conn_id,
        namespace=f"ui_{suffix}",
    )
    pipeline.create_table(TABLE)
    pipeline.create_table(OTHER_TABLE)
    world = UiWorld(tmp, pipeline, catalog_conn_id)
    coordinator = pipeline.coordinator(SINK, pipeline.iceberg_committer())
    other = pipeline.coordinator(OTHER_SINK, pipeline.iceberg_committer())
    store = pipeline.store

    def persist(sink_id: str, epoch: int, dag_id: str | None, rows: int = 5) -> PreCommit:
        pre = pipeline.write_iceberg(sink_id, epoch, [TABLE if sink_id == SINK else OTHER_TABLE], rows)
        run_id = f"scheduled__{epoch}" if dag_id else None
        (coordinator if sink_id == SINK else other).persist(pre, run_id=run_id, try_number=1, dag_id=dag_id)
        if sink_id == SINK:
            world.writes[epoch] = pre
        return pre

    E = Epochs
    for epoch in (E.COMMITTED, E.TO_COMMIT, E.ABORT_REFUSED, E.WAITING_BROWSER, E.ABORTED):
        persist(SINK, epoch, DAG_ID)
    persist(SINK, E.CHECKPOINT_FAILED, DAG_ID, rows=3)
    persist(SINK, E.WAITING_API, DAG_ID)
    persist(SINK, E.NO_DAG, None)
    for epoch in (E.COMMITTED, E.TO_COMMIT, E.ABORT_REFUSED):
        pipeline.checkpoint(SINK, epoch, CheckpointStatus.COMPLETED)
    pipeline.checkpoint(SINK, E.CHECKPOINT_FAILED, CheckpointStatus.FAILED)
    coordinator.commit(SINK, E.COMMITTED)
    # Aborted by a crash before its clean-up: the row says Aborted, the files are still there.
    store.mark_aborted(SINK, E.ABORTED, write_id=world.writes[E.ABORTED].write_id, reason="crash before clean-up")
    store.record_error(
        SINK,
        E.CHECKPOINT_FAILED,
        write_id=world.writes[E.CHECKPOINT_FAILED].write_id,
        error="CheckpointFailed: upstream checkpoint FAILED (landing job exited 1)",
    )
    for n in range(2):
        epoch = BASE + n * HOUR
        persist(OTHER_SINK, epoch, OTHER_DAG_ID)
        pipeline.checkpoint(OTHER_SINK, epoch, CheckpointStatus.COMPLETED)
        other.commit(OTHER_SINK, epoch)
    # The first epoch reprocessed: a newer generation's write replaced it (its page lists both revisions).
    reprocessing = pipeline.coordinator(OTHER_SINK, pipeline.iceberg_committer(), on_reprocess={OTHER_SINK: "replace"})
    world.replaced = store.get(OTHER_SINK, BASE).write_id  # type: ignore[union-attr]
    correction = pipeline.write_iceberg(OTHER_SINK, BASE, [OTHER_TABLE]).model_copy(
        update={"generation": "2030-01-01T00:00:00.000000Z/0000000001"}
    )
    reprocessing.persist(correction, run_id=f"scheduled__{BASE}", try_number=2, dag_id=OTHER_DAG_ID)
    reprocessing.commit(OTHER_SINK, BASE)
    world.replacing = correction.write_id
    # A re-delivered hour: its first write given up (the upstream failed it), a second delivery committed.
    given_up = persist(OTHER_SINK, REDELIVERED, OTHER_DAG_ID)
    store.mark_aborted(OTHER_SINK, REDELIVERED, write_id=given_up.write_id, reason="the upstream gave the hour up")
    again = pipeline.write_iceberg(OTHER_SINK, REDELIVERED, [OTHER_TABLE])
    other.persist(again, run_id=f"scheduled__{REDELIVERED}", try_number=2, dag_id=OTHER_DAG_ID)
    pipeline.checkpoint(OTHER_SINK, REDELIVERED, CheckpointStatus.COMPLETED)
    other.commit(OTHER_SINK, REDELIVERED)
    kept_out = pipeline.write_iceberg(OTHER_SINK, KEPT_OUT, [OTHER_TABLE]).model_copy(
        update={"generation": "2030-01-01T00:00:00.000000Z/0000000002"}
    )
    assert other.persist(kept_out, run_id=f"backfill__{KEPT_OUT}", try_number=1, dag_id=OTHER_DAG_ID).warning
    # The operators register each sink they persist for (the recovery DAG and the view read it).
    for sink_id, table in ((SINK, TABLE), (OTHER_SINK, OTHER_TABLE)):
        config = IcebergSinkConfig(sink_id, (f"{pipeline.namespace}.{table}",), iceberg_conn_id=catalog_conn_id)
        store.registry.register_sink(
            sink_id, config.model_dump(mode="json"), MetaStoreCheckpoint().model_dump(mode="json")
        )
    _build_hardening_world(world)
    _build_shared_world(world)
    _build_causes_world(world)
    _build_audited_world(world)
    return world


def _build_audited_world(world: UiWorld) -> None:
    """``AUDITED_SINK`` (issue 58): registered audited as ``exactly_once_epoch(audit=...)`` registers
    it, its epochs audited by a real coordinator onto audit branches of a real table."""
    from airflow_provider_exactly_once.core.epochs import AuditCheck

    pipeline, store = world.pipeline, world.pipeline.store
    pipeline.create_table(AUDITED_TABLE)
    config = IcebergSinkConfig(
        AUDITED_SINK, (f"{pipeline.namespace}.{AUDITED_TABLE}",), iceberg_conn_id=world.catalog_conn_id, audited=True
    )
    store.registry.register_sink(
        AUDITED_SINK, config.model_dump(mode="json"), MetaStoreCheckpoint().model_dump(mode="json")
    )
    coordinator = pipeline.coordinator(AUDITED_SINK, pipeline.iceberg_committer(), audited=[AUDITED_SINK])
    passed = [AuditCheck(name="row_count", passed=True)]
    failed = [*passed, *(AuditCheck(name=n, passed=False, message=m) for n, m in Audited.FAILED_CHECKS)]
    A = Audited
    for epoch in (A.PUBLISHED, A.AUDITING, A.AUDITED, A.FAILED, A.FAILED_API, A.FAILED_BROWSER):
        pre = pipeline.write_iceberg(AUDITED_SINK, epoch, [AUDITED_TABLE])
        coordinator.persist(pre, run_id=f"scheduled__{epoch}", try_number=1, dag_id=DAG_ID)
        world.audited_writes[epoch] = pre
        pipeline.checkpoint(AUDITED_SINK, epoch, CheckpointStatus.COMPLETED)
        coordinator.commit_audit(AUDITED_SINK, epoch)
        if epoch != A.AUDITING:
            checks = failed if epoch in (A.FAILED, A.FAILED_API, A.FAILED_BROWSER) else passed
            coordinator.judge_audit(AUDITED_SINK, epoch, checks, write_id=pre.write_id)
    coordinator.commit(AUDITED_SINK, A.PUBLISHED)


def _build_causes_world(world: UiWorld) -> None:
    """``SILVER_SINK`` (issue 55): a failed write's epoch aborted by its run and read again by the next,
    and an epoch reserved by a run killed hours ago; ``LIVE_SINK``'s epochs of runs alive."""
    pipeline, store = world.pipeline, world.pipeline.store
    pipeline.create_table(SILVER_TABLE)
    pipeline.create_table(LIVE_SINK)
    for sink_id, table, checkpoint in (
        (SILVER_SINK, SILVER_TABLE, SnapshotRangeCheckpoint()),
        (LIVE_SINK, LIVE_SINK, MetaStoreCheckpoint()),
    ):
        config = IcebergSinkConfig(sink_id, (f"{pipeline.namespace}.{table}",), iceberg_conn_id=world.catalog_conn_id)
        store.registry.register_sink(sink_id, config.model_dump(mode="json"), checkpoint.model_dump(mode="json"))
    coordinator = pipeline.coordinator(SILVER_SINK, pipeline.iceberg_committer())

    def task(task_id: str, run_id: str, try_number: int = 1) -> Actor:
        return Actor(
            ActorKind.TASK, name=f"{SILVER_DAG}.{task_id}", dag_id=SILVER_DAG, run_id=run_id, try_number=try_number
        )

    def incremental(epoch: int, upstream_at: int) -> None:
        run_id = Silver.RUNS[epoch]
        reserved = reserved_range(store, SILVER_SINK, epoch, SILVER_UPSTREAM, lambda: upstream_at, run_id=run_id)
        written = pipeline.write_iceberg(SILVER_SINK, epoch, [SILVER_TABLE])
        pre = PreCommit.model_validate({**written.model_dump(), "source_positions": reserved.positions(records=5)})
        with acting(task("exactly_once_silver.persist", run_id)):
            coordinator.persist(pre, run_id=run_id, try_number=1, dag_id=SILVER_DAG)
        pipeline.checkpoint(SILVER_SINK, epoch, CheckpointStatus.COMPLETED)
        coordinator.commit(SILVER_SINK, epoch)

    incremental(Silver.COMMITTED, 100)
    failed = Silver.RUNS[Silver.ABORTED]
    reserved_range(store, SILVER_SINK, Silver.ABORTED, SILVER_UPSTREAM, lambda: 200, run_id=failed)
    for attempt in (1, 2):
        with acting(task(SILVER_WRITE, failed, attempt)):
            store.history.record_failure(SILVER_SINK, Silver.ABORTED, CAST_OVERFLOW, final=attempt == 2)
    with acting(task("exactly_once_silver.abort", failed)):
        reason = run_failure(store.history.events(SILVER_SINK, Silver.ABORTED), failed)
        assert reason is not None
        coordinator.abort(SILVER_SINK, Silver.ABORTED, reason=reason, dag_id=SILVER_DAG)
    incremental(Silver.AGAIN, 300)
    reserved_range(store, SILVER_SINK, Silver.RESERVED, SILVER_UPSTREAM, lambda: 400, run_id=Silver.KILLED_RUN)
    age_rows(store, SILVER_SINK, Silver.RESERVED, timedelta(hours=QUIET_HOURS))

    live = pipeline.coordinator(LIVE_SINK, pipeline.iceberg_committer())
    for epoch, run_id in Live.RUNS.items():
        live.persist(
            pipeline.write_iceberg(LIVE_SINK, epoch, [LIVE_SINK]), run_id=run_id, try_number=1, dag_id=SILVER_DAG
        )
        age_rows(store, LIVE_SINK, epoch, timedelta(hours=QUIET_HOURS))


def _build_shared_world(world: UiWorld) -> None:
    """``SHARED_SINK``, written by the partner's DAG and another, and ``BROKEN_SINK``'s epoch."""
    pipeline, store = world.pipeline, world.pipeline.store
    pipeline.create_table(SHARED_TABLE)
    table = f"{pipeline.namespace}.{SHARED_TABLE}"
    config = IcebergSinkConfig(SHARED_SINK, (table,), iceberg_conn_id=world.catalog_conn_id)
    store.registry.register_sink(
        SHARED_SINK, config.model_dump(mode="json"), MetaStoreCheckpoint().model_dump(mode="json")
    )
    coordinator = pipeline.coordinator(SHARED_SINK, pipeline.iceberg_committer())

    def task(dag_id: str, task_id: str, run_id: str) -> Actor:
        return Actor(ActorKind.TASK, name=f"{dag_id}.{task_id}", dag_id=dag_id, run_id=run_id, try_number=1)

    def write() -> PreCommit:
        return pipeline.write_iceberg(SHARED_SINK, Shared.OWNED, [SHARED_TABLE])

    first, late, own = ELSEWHERE_RUNS
    with acting(task(ELSEWHERE_DAG, ELSEWHERE_TASK, first)):
        given_up = write()
        coordinator.persist(given_up, run_id=first, try_number=1, dag_id=ELSEWHERE_DAG)
        reason = f"{ELSEWHERE_DAG}.{ELSEWHERE_TASK} gave up in run {first}: its upstream failed"
        store.mark_aborted(SHARED_SINK, Shared.OWNED, write_id=given_up.write_id, reason=reason)
    with acting(task(PARTNER_DAG, "load", PARTNER_RUN)):
        coordinator.persist(write(), run_id=PARTNER_RUN, try_number=1, dag_id=PARTNER_DAG)
        pipeline.checkpoint(SHARED_SINK, Shared.OWNED, CheckpointStatus.COMPLETED)
        coordinator.commit(SHARED_SINK, Shared.OWNED)
    with acting(task(ELSEWHERE_DAG, ELSEWHERE_TASK, late)):
        assert coordinator.persist(write(), run_id=late, try_number=1, dag_id=ELSEWHERE_DAG).warning
        theirs = pipeline.write_iceberg(SHARED_SINK, Shared.THEIRS, [SHARED_TABLE])
        # Issue 55: its next task failed on the epoch, naming its DAG; its run is in Airflow (its log
        # is linked for an admin, never for the partner).
        store.history.record_failure(
            SHARED_SINK, Shared.OWNED, f"ValueError: {ELSEWHERE_DAG} lost a column", final=False
        )
    with acting(task(ELSEWHERE_DAG, ELSEWHERE_TASK, own)):
        coordinator.persist(theirs, run_id=own, try_number=1, dag_id=ELSEWHERE_DAG)

    pre = empty_write(BROKEN_SINK, BROKEN_EPOCH, f"{pipeline.namespace}.broken", f"file://{pipeline.warehouse}/broken")
    store.insert_pending(pre, run_id="scheduled__broken", try_number=1, dag_id=PARTNER_DAG)
    plant_stored_write(store.engine, pre, source_positions=OPEN_RANGE)


def _build_hardening_world(world: UiWorld) -> None:
    """The per-DAG sink, the sink with planted credentials, and the sink whose catalog is down."""
    pipeline, store = world.pipeline, world.pipeline.store
    pipeline.create_table(PAGED_SINK)
    paged_table = f"{pipeline.namespace}.{PAGED_SINK}"
    paged = IcebergSinkConfig(PAGED_SINK, (paged_table,), iceberg_conn_id=world.catalog_conn_id)
    store.registry.register_sink(
        PAGED_SINK, paged.model_dump(mode="json"), MetaStoreCheckpoint().model_dump(mode="json")
    )
    location = f"file://{pipeline.warehouse}/paged"
    for epoch in (*MINE_EPOCHS, *THEIRS_EPOCHS):
        dag_id = MINE_DAG if epoch in MINE_EPOCHS else THEIRS_DAG
        pre = empty_write(PAGED_SINK, epoch, paged_table, location)
        store.insert_pending(pre, run_id=f"scheduled__{epoch}", try_number=1, dag_id=dag_id)

    # Registered as a deployment from before credentials were refused in sink roots would have it.
    root = world.secret_root
    secret = register_file_sink_with_root(
        store, SECRET_SINK, root, epoch=SECRET_EPOCH, dag_id=SECRET_DAG, run_id="scheduled__secret"
    )
    store.record_error(
        SECRET_SINK,
        SECRET_EPOCH,
        write_id=secret.write_id,
        error=f"SinkUnavailable: cannot list {root}/_eo/w1: connection reset",
    )

    world.dead_port = free_port()  # nothing listens there
    dead_table = f"{pipeline.namespace}.dead"
    dead = IcebergSinkConfig(DEAD_SINK, (dead_table,), iceberg_conn_id=world.dead_conn_id)
    store.registry.register_sink(DEAD_SINK, dead.model_dump(mode="json"), MetaStoreCheckpoint().model_dump(mode="json"))
    pre = empty_write(DEAD_SINK, DEAD_EPOCH, dead_table, f"file://{pipeline.warehouse}/dead")
    store.insert_pending(pre, run_id=f"scheduled__{DEAD_EPOCH}", try_number=1, dag_id=DAG_ID)


# -- the sinks the picture is judged on (issue 55) ------------------------------------------------------
#: 1, 50 and 500 epochs over a day and over two years, each case a sink of its own, made through the
#: store's own transitions on the session's meta store (a coordinator and a table per epoch would take
#: minutes). Every one is older than the other sinks' epochs, so the listings other tests read keep
#: their first pages; only a test asking for ``picture_sinks`` makes them.
PICTURE_SIZES = (1, 50, 500)
PICTURE_STARTS = {"day": datetime(2025, 12, 30, tzinfo=UTC), "years": datetime(2024, 1, 1, tzinfo=UTC)}
#: The causes D22 keeps, as a failed write and a refusal by the package's rules read on the row.
CAST_OVERFLOW = (
    'write failed on try 2: SparkArithmeticException: [CAST_OVERFLOW] The value 1.0E32D of the type "DOUBLE" '
    'cannot be cast to "BIGINT" due to an overflow. Use `try_cast` to tolerate overflow and return NULL instead. '
    'If necessary set "spark.sql.ansi.enabled" to "false" to bypass this error. SQLSTATE: 22003'
)
REFUSED = (
    "write was refused on try 1: EarlierEpochUndecided: sink {sink!r} epoch {epoch}: an earlier epoch is still "
    "Pending; commit or abort it first (eo-sink commit / eo-sink abort), then clear this run's write task"
)
#: Planted in a cause and a warning: shown as text, never as an element.
MARKUP = "<img src=x onerror=alert(1) class=planted>"


@dataclass(frozen=True)
class PictureSink:
    """One case's sink and what its epochs are, oldest first."""

    sink_id: str
    epochs: tuple[int, ...]
    #: Aborted epochs and their cause, as the row keeps it (its ``error``).
    aborted: dict[int, str]
    #: Committed epochs that keep a warning (a refused reprocess).
    warned: dict[int, str]
    revised: dict[int, int]
    pending: tuple[int, ...]


def picture_sink_id(span: str, size: int) -> str:
    return f"picture-{span}-{size}"


def _picture_epochs(span: str, size: int) -> list[int]:
    """``size`` epochs at whole minutes of one day, or at the starts of days over two years."""
    chosen = random.Random(f"{span}-{size}")
    start = PICTURE_STARTS[span]
    step, slots = (timedelta(minutes=1), 1440) if span == "day" else (timedelta(days=1), 730)
    return [int((start + step * n).timestamp() * 1000) for n in sorted(chosen.sample(range(slots), size))]


def _picture_roles(size: int) -> dict[int, str]:
    """Which index plays which part: aborted at the left edge, three side by side and here and there;
    a revision 1 beside a revision 2; warnings; the newest two Pending. One epoch alone is aborted."""
    if size == 1:
        return {0: "aborted"}
    roles = {i: "aborted" for i in (0, size // 3, size // 3 + 1, size // 3 + 2, *range(5, size - 2, 37))}
    half = size // 2
    roles.update({half: "r1", half + 1: "r2", half + 3: "warned", half + 4: "warned"})
    roles.update({i: "r1" for i in range(11, size - 2, 23) if i not in roles})
    roles.update({i: "warned" for i in range(17, size - 2, 41) if i not in roles})
    roles.update({size - 2: "pending", size - 1: "pending"})
    return roles


def _build_picture_sink(world: UiWorld, span: str, size: int) -> PictureSink:
    store = world.pipeline.store
    sink_id = picture_sink_id(span, size)
    table = f"{world.pipeline.namespace}.{sink_id.replace('-', '_')}"
    config = IcebergSinkConfig(sink_id, (table,), iceberg_conn_id=world.catalog_conn_id)
    store.registry.register_sink(sink_id, config.model_dump(mode="json"), MetaStoreCheckpoint().model_dump(mode="json"))
    epochs, roles = _picture_epochs(span, size), _picture_roles(size)
    aborted: dict[int, str] = {}
    warned: dict[int, str] = {}
    revised: dict[int, int] = {}
    batch: list[PreCommit] = []

    def commit_batch() -> None:
        store.decide_commits(sink_id, [(p.epoch, p.write_id) for p in batch])
        marks = [CommitMark(p.epoch, p.write_id, {table: str(5_000_000_000 + p.epoch % 10**9)}, {}) for p in batch]
        assert len(store.mark_committed_batch(sink_id, marks)) == len(batch)
        batch.clear()

    for i, epoch in enumerate(epochs):
        role = roles.get(i, "committed")
        pre = make_pre_commit(sink_id, epoch, tables=(table,), files=1 + i % 3)
        run_id = f"scheduled__{sink_id}-{i}"
        store.insert_pending(pre, run_id=run_id, try_number=1, dag_id=DAG_ID)
        if role == "aborted":
            cause = CAST_OVERFLOW if len(aborted) % 2 == 0 else REFUSED.format(sink=sink_id, epoch=epoch)
            cause += f" {MARKUP}" if len(aborted) == 1 else ""
            store.mark_aborted(sink_id, epoch, write_id=pre.write_id, reason=cause)
            aborted[epoch] = cause
        elif role == "pending":
            if i == size - 1:
                error = "CheckpointFailed: upstream checkpoint FAILED (landing job exited 1)"
                store.record_error(sink_id, epoch, write_id=pre.write_id, error=error)
        else:
            batch.append(pre)
            if role in ("r1", "r2", "warned") or len(batch) >= 7:
                commit_batch()
            for revision in range({"r1": 1, "r2": 2}.get(role, 0)):
                again = make_pre_commit(sink_id, epoch, tables=(table,))
                store.revisions.open_revision(
                    again,
                    expected_write_id=pre.write_id,
                    run_id=f"{run_id}-r{revision + 1}",
                    try_number=1,
                    dag_id=DAG_ID,
                )
                store.decide_commit(sink_id, epoch, write_id=again.write_id)
                store.mark_committed(sink_id, epoch, write_id=again.write_id, committed={table: str(6_000_000_000 + i)})
                pre, revised[epoch] = again, revision + 1
            if role == "warned":
                warning = f"refused: a reprocess of this epoch by run backfill__{i} kept out (on_reprocess='keep')"
                warning += f" {MARKUP}" if len(warned) == 1 else ""
                store.record_warning(sink_id, epoch, warning=warning)
                warned[epoch] = warning
    if batch:
        commit_batch()
    pending = tuple(e for i, e in enumerate(epochs) if roles.get(i) == "pending")
    return PictureSink(sink_id, tuple(epochs), aborted, warned, revised, pending)


@pytest.fixture(scope="session")
def picture_sinks(api_server: ApiServer) -> dict[tuple[str, int], PictureSink]:
    """The six cases' sinks in the API server's meta store, by (span, size)."""
    return {
        (span, size): _build_picture_sink(api_server.world, span, size)
        for span in PICTURE_STARTS
        for size in PICTURE_SIZES
    }


@dataclass
class ApiServer:
    """The running API server: its URL, its users' passwords, and the world behind it."""

    url: str
    passwords: dict[str, str]
    world: UiWorld
    log: Path
    _tokens: dict[str, str] = field(default_factory=dict)

    def token(self, username: str) -> str:
        """A JWT from Airflow's own login endpoint (``POST /auth/token``), as any API client gets one."""
        if username not in self._tokens:
            response = httpx.post(
                f"{self.url}/auth/token",
                json={"username": username, "password": self.passwords[username]},
                timeout=30,
            )
            assert response.status_code == 201, response.text
            self._tokens[username] = response.json()["access_token"]
        return self._tokens[username]

    def client(self, username: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.token(username)}"} if username else {}
        return httpx.Client(base_url=f"{self.url}/exactly-once", headers=headers, timeout=60)


def _server_env(home: Path, world: UiWorld, port: int, passwords_file: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW_", "AIRFLOW__"))}
    env.update(
        {
            # The test auth manager is imported by name, from this repository.
            "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p),
            "EO_TEST_DAGS_BY_USER": json.dumps({LIMITED: [MINE_DAG], PARTNER: [PARTNER_DAG]}),
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
            "AIRFLOW__CORE__AUTH_MANAGER": "tests.plugins.ui.auth_manager.PerDagAuthManager",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(f"{u}:{r}" for u, r in USERS.items()),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords_file),
            "AIRFLOW__API_AUTH__JWT_SECRET": uuid.uuid4().hex,
            "AIRFLOW__API__SECRET_KEY": uuid.uuid4().hex,
            "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(port),
            "AIRFLOW__API__WORKERS": "1",
            # The view's meta store and the sinks' catalog, as connections (the default meta id).
            "AIRFLOW_CONN_EXACTLY_ONCE_DEFAULT": json.dumps(
                {"conn_type": "exactly_once_meta", "host": world.pipeline.meta_url}
            ),
            f"AIRFLOW_CONN_{world.catalog_conn_id.upper()}": json.dumps(
                {
                    "conn_type": "iceberg",
                    "extra": {
                        "type": "sql",
                        "uri": world.pipeline.catalog_url,
                        "warehouse": f"file://{world.pipeline.warehouse}",
                    },
                }
            ),
            f"AIRFLOW_CONN_{world.dead_conn_id.upper()}": json.dumps(
                {"conn_type": "iceberg", "extra": {"type": "sql", "uri": world.dead_catalog_uri}}
            ),
        }
    )
    return env


#: The DAGs the limited user's listing is decided over: Airflow answers "which DAGs may this user
#: read" from its own ``dag`` table, so they are registered there as the DAG processor would. The
#: run of the epoch the browser opens exists, so the view links it (it links no run Airflow lacks).
_REGISTER_DAGS = f"""
from airflow.models.dag import DagModel
from airflow.models.dagbundle import DagBundleModel
from airflow.models.dagrun import DagRun
from airflow.utils.session import create_session
from airflow.utils.timezone import utcnow

with create_session() as session:
    session.add(DagBundleModel(name="eo-ui-tests"))
    session.flush()
    for dag_id in {[MINE_DAG, THEIRS_DAG, DAG_ID, PARTNER_DAG, ELSEWHERE_DAG]!r}:
        session.add(DagModel(dag_id=dag_id, bundle_name="eo-ui-tests", fileloc=f"/dags/{{dag_id}}.py"))
    session.flush()
    session.add(
        DagRun(dag_id={DAG_ID!r}, run_id="scheduled__{Epochs.WAITING_BROWSER}", run_type="scheduled", run_after=utcnow())
    )
    # Issue 55: the runs of the failed epochs (their logs linked), a killed run Airflow still calls
    # running, and runs quiet for hours but alive.
    from datetime import timedelta

    from sqlalchemy import insert

    from airflow.models.taskinstance import TaskInstance

    quiet = utcnow() - timedelta(hours={QUIET_HOURS})
    runs = [
        ({SILVER_DAG!r}, {Silver.RUNS[Silver.ABORTED]!r}, "failed", [({SILVER_WRITE!r}, "failed", quiet)]),
        ({ELSEWHERE_DAG!r}, {ELSEWHERE_RUNS[1]!r}, "failed", [({ELSEWHERE_TASK!r}, "failed", quiet)]),
        ({SILVER_DAG!r}, {Silver.KILLED_RUN!r}, "running", [({SILVER_WRITE!r}, "running", quiet)]),
        ({SILVER_DAG!r}, {Live.RUNS[Live.DEFERRED]!r}, "running", [("wait_for_checkpoint", "deferred", quiet)]),
        ({SILVER_DAG!r}, {Live.RUNS[Live.BEATING]!r}, "running", [("commit", "running", utcnow())]),
    ]
    session.add(DagModel(dag_id={SILVER_DAG!r}, bundle_name="eo-ui-tests", fileloc="/dags/silver.py"))
    for dag_id, run_id, state, tasks in runs:
        session.add(DagRun(dag_id=dag_id, run_id=run_id, run_type="manual", state=state, run_after=quiet))
        session.flush()
        for task_id, task_state, at in tasks:
            session.execute(
                insert(TaskInstance).values(
                    task_id=task_id, dag_id=dag_id, run_id=run_id, map_index=-1, try_number=1, state=task_state,
                    pool="default_pool", start_date=at, updated_at=at,
                    last_heartbeat_at=at if task_state == "running" else None,
                )
            )
"""


def _wait_until_up(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"airflow api-server exited with {process.returncode}:\n{log.read_text()[-4000:]}")
        try:
            if httpx.get(f"{url}/api/v2/monitor/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"airflow api-server not up after {STARTUP_TIMEOUT_S} s:\n{log.read_text()[-4000:]}")


@pytest.fixture(scope="session")
def api_server() -> Iterator[ApiServer]:
    tmp = Path(tempfile.mkdtemp(prefix="eo-ui-"))
    home = tmp / "airflow"
    (home / "dags").mkdir(parents=True)
    world_dir = tmp / "world"
    world_dir.mkdir()
    world = _build_world(world_dir)
    passwords = {u: f"{u}-{uuid.uuid4().hex[:12]}" for u in USERS}
    passwords_file = home / "passwords.json"
    passwords_file.write_text(json.dumps(passwords))
    port = free_port()
    env = _server_env(home, world, port, passwords_file)
    airflow = str(Path(sys.executable).with_name("airflow"))
    # The metadata DB from the ORM (what ``airflow db migrate`` ends with, in a fraction of the time).
    subprocess.run(
        [sys.executable, "-c", "from airflow.utils import db; db.initdb()"],
        env=env,
        check=True,
        capture_output=True,
        timeout=300,
    )
    subprocess.run([sys.executable, "-c", _REGISTER_DAGS], env=env, check=True, capture_output=True, timeout=300)
    log = tmp / "api-server.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [airflow, "api-server", "--port", str(port), "--host", "127.0.0.1", "--workers", "1"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_until_up(url, process, log)
        yield ApiServer(url, passwords, world, log)
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        world.pipeline.dispose()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def artifacts() -> Path:
    """Where screenshots go: ``$EO_TEST_ARTIFACTS/ui`` (default ``test-artifacts/ui``)."""
    path = Path(os.environ.get("EO_TEST_ARTIFACTS", "test-artifacts")) / "ui"
    path.mkdir(parents=True, exist_ok=True)
    return path


def json_of(response: httpx.Response) -> Any:
    assert response.headers.get("content-type", "").startswith("application/json"), response.text[:500]
    return response.json()
