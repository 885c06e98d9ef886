"""A whole epoch DAG (``exactly_once_epoch`` after the real ``SparkPreCommitOperator``) run with
``dag.test()`` against SeaweedFS: the Iceberg table behind its REST catalog, reached through an
``iceberg`` connection configured as docs/deployment.md says (OAuth2 client credentials in
login/password, the ``s3.*`` keys in the extra); the landed Parquet files and the ``_SUCCESS``
marker on S3, the marker read through an ``aws`` connection (``storage_conn_id``). The landed files
are read by the Spark writer with the ``s3.*`` keys of the Iceberg connection: an input spec has no
``storage_conn_id`` of its own.

Then the secret (the S3 secret key, which is also the REST client secret of the local server) is
looked for everywhere a run leaves text behind: the task logs (``dag.test()`` runs the tasks in this
process and writes no log file: their logs, spark-submit's output included, are this process's
output, captured at the file descriptors; any file under the logs folder is read too), every
rendered template field, every XCom value, every row of every meta-store table, ``eo-sink
status/show/epochs --json`` (the installed script) and the sink-state view's JSON API and epoch page
(the plugin's FastAPI app in process, SimpleAuthManager deciding for an admin; the API server's
bearer-token check is left out). The grep itself is checked to find a planted secret, and the secret
looked for is checked to be the one in the connections the run was given.

Also one SigV4 variant: the REST catalog signed with AWS SigV4 (``rest.sigv4-enabled``), through
the same ``iceberg`` connection type, commits an epoch through the coordinator.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import s3fs
import sqlalchemy as sa
from pyiceberg.catalog import Catalog, load_catalog

from airflow_provider_exactly_once.checkpoints.config import MarkerFileCheckpoint
from airflow_provider_exactly_once.core.epochs import EpochStatus, epoch_from_interval_start
from airflow_provider_exactly_once.core.precommit import COMPRESSED_PREFIX, PreCommit
from airflow_provider_exactly_once.operators.spark_precommit import SparkPreCommitOperator
from airflow_provider_exactly_once.sinks.config import IcebergSinkConfig
from airflow_provider_exactly_once.store import SqlSinkStateStore
from airflow_provider_exactly_once.task_groups import exactly_once_epoch
from demo.servers import ACCESS_KEY, REGION, SECRET_KEY, SeaweedFS
from tests.hooks.s3_connection import aws_connection, define_connection
from tests.spark.conftest import TABLE_SCHEMA, sample_rows, spark_env
from tests.support import independent_reader
from tests.support.airflow_world import run, ti_states
from tests.support.builders import make_pre_commit

pytestmark = pytest.mark.spark

DAY = dt.datetime(2024, 3, 1, tzinfo=dt.UTC)
EPOCH = epoch_from_interval_start(DAY)
G = "eo"
ROWS = 240
EO_SINK = Path(sys.executable).with_name("eo-sink")
#: What the Spark job gets from the DAG author: nothing that reaches storage.
SPARK_CONF = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.driver.memory": "768m",
    "spark.pyspark.python": sys.executable,
}


# -- the grep ---------------------------------------------------------------------------------------


def leaks(secret: str, places: Mapping[str, str]) -> list[str]:
    """The names of the places whose text holds ``secret``."""
    return sorted(name for name, text in places.items() if secret in text)


def expand(value: Any) -> str:
    """Text of a stored value, with a compressed pre-commit deflated (a secret would hide in zlib)."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if isinstance(value, str) and value.startswith(COMPRESSED_PREFIX):
        text += "\n" + PreCommit.parse(value).model_dump_json()
    if isinstance(value, str) and f'"{COMPRESSED_PREFIX}' in value:
        for part in value.split('"'):
            if part.startswith(COMPRESSED_PREFIX):
                text += "\n" + PreCommit.parse(part).model_dump_json()
    return text


def test_the_grep_finds_a_planted_secret_in_plain_and_compressed_text() -> None:
    """The sanity check of the helpers the leak test relies on: they can fail."""
    # A secret in a write's file path (a planted credential), inside the compressed XCom form.
    planted = make_pre_commit("s", 0, tables=(f"db.t_{SECRET_KEY.replace('-', '_')}",))
    secret = SECRET_KEY.replace("-", "_")
    compressed = planted.to_compressed()
    assert secret not in compressed  # deflated: a plain grep would miss it
    places = {
        "clean": "nothing here",
        "plain": f"... s3.secret-access-key={secret} ...",
        "xcom": expand(compressed),
        "json": expand(json.dumps({"v": compressed})),
    }
    assert leaks(secret, places) == ["json", "plain", "xcom"]


# -- the world --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Lake:
    """A namespace of this test's own in the REST catalog and a prefix of its own in the plain bucket."""

    seaweed: SeaweedFS
    namespace: str
    prefix: str
    fs: s3fs.S3FileSystem

    @property
    def landing(self) -> str:
        return f"s3://{self.seaweed.bucket}/{self.prefix}/landing"

    def catalog(self, **overrides: str) -> Catalog:
        return load_catalog(f"check_{uuid.uuid4().hex[:6]}", **{**self.seaweed.catalog_properties(), **overrides})

    def land(self, rows: pa.Table, day: dt.datetime, parts: int = 2) -> None:
        folder = f"{self.seaweed.bucket}/{self.prefix}/landing/{day:%Y/%m/%d}"
        size = -(-rows.num_rows // parts)
        for i in range(parts):
            with self.fs.open(f"{folder}/part-{i}.parquet", "wb") as handle:
                pq.write_table(rows.slice(i * size, size), handle)
        self.fs.pipe_file(f"{folder}/_SUCCESS", b"")


@pytest.fixture
def lake(seaweed: SeaweedFS, unique: str) -> Iterator[Lake]:
    fs = s3fs.S3FileSystem(**seaweed.s3fs_options(), skip_instance_cache=True)
    place = Lake(seaweed, f"eo_{unique}", f"dag-{unique}", fs)
    catalog = place.catalog()
    catalog.create_namespace(place.namespace)
    yield place
    if seaweed.running:
        fs.invalidate_cache()
        if fs.exists(f"{seaweed.bucket}/{place.prefix}"):
            fs.rm(f"{seaweed.bucket}/{place.prefix}", recursive=True)


def rest_connection(seaweed: SeaweedFS) -> dict[str, Any]:
    """The ``iceberg`` connection of docs/deployment.md's REST section, for this SeaweedFS."""
    return {
        "conn_type": "iceberg",
        "host": seaweed.catalog_uri,
        "login": ACCESS_KEY,  # the OAuth2 client id ...
        "password": SECRET_KEY,  # ... and client secret (SeaweedFS takes its S3 identity's keys)
        "extra": {
            "type": "rest",
            "warehouse": seaweed.warehouse,
            "s3.endpoint": seaweed.s3_endpoint,
            "s3.access-key-id": ACCESS_KEY,
            "s3.secret-access-key": SECRET_KEY,
            "s3.region": REGION,
        },
    }


def no_ambient_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever reaches storage, reaches it with what a connection says."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


# -- the leak test ----------------------------------------------------------------------------------


def test_an_epoch_dag_on_seaweedfs_commits_once_and_no_secret_is_left_anywhere(
    airflow_home: Path,
    lake: Lake,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    seaweed = lake.seaweed
    no_ambient_credentials(monkeypatch)
    for name, value in spark_env().items():
        if name.startswith(("PYSPARK", "SPARK_LOCAL", "PATH")):
            monkeypatch.setenv(name, value)
    suffix = uuid.uuid4().hex[:8]
    meta_url = f"sqlite:///{tmp_path / 'meta.db'}"
    meta_conn_id, iceberg_conn_id, spark_conn_id = f"eo_meta_{suffix}", f"lake_{suffix}", f"spark_{suffix}"
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{meta_conn_id.upper()}", json.dumps({"conn_type": "exactly_once_meta", "host": meta_url})
    )
    monkeypatch.setenv(f"AIRFLOW_CONN_{iceberg_conn_id.upper()}", json.dumps(rest_connection(seaweed)))
    monkeypatch.setenv(f"AIRFLOW_CONN_{spark_conn_id.upper()}", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    storage_conn_id = define_connection(monkeypatch, aws_connection(seaweed))

    table_name = f"{lake.namespace}.orders"
    lake.catalog().create_table(table_name, TABLE_SCHEMA)
    rows = sample_rows(ROWS)
    lake.land(rows, DAY)

    sink = IcebergSinkConfig(f"orders-{suffix}", (table_name,), iceberg_conn_id=iceberg_conn_id)
    checkpoint = MarkerFileCheckpoint(lake.landing + "/{start:%Y/%m/%d}", storage_conn_id=storage_conn_id)
    from airflow.sdk import DAG

    with DAG(
        f"eo_s3_{suffix}",
        schedule="@daily",
        start_date=dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
        catchup=False,
    ) as dag:
        write = SparkPreCommitOperator(
            task_id="write",
            conn_id=spark_conn_id,
            sink=sink,
            input={"kind": "files", "format": "parquet", "path": lake.landing + "/{start:%Y/%m/%d}"},
            meta_conn_id=meta_conn_id,
            conf=SPARK_CONF,
        )
        exactly_once_epoch(
            write,
            sink=sink,
            checkpoint=checkpoint,
            meta_conn_id=meta_conn_id,
            group_id=G,
            sensor_kwargs={"poke_interval": 0.5, "timeout": 120},
            commit_retries=1,
            commit_retry_delay=dt.timedelta(0),
        )

    dr = run(dag, DAY)

    captured = capfd.readouterr()
    states = ti_states(dag.dag_id, dr.run_id)
    assert dr.state == "success", (states, (captured.out + captured.err)[-6000:])
    assert {task: state for task, (state, _) in states.items()} == {
        "write": "success",
        f"{G}.persist": "success",
        f"{G}.wait_for_checkpoint": "success",
        f"{G}.commit": "success",
        f"{G}.abort": "skipped",
    }, states
    assert states["write"][1] == 1 and states[f"{G}.commit"][1] == 1, states  # no retry hid a failure

    # -- committed, once, as another engine reads it --------------------------------------------
    store = SqlSinkStateStore(meta_url)
    try:
        row = store.get(sink.sink_id, EPOCH)
        assert row is not None and row.status is EpochStatus.COMMITTED, row
        write_id = row.write_id
    finally:
        store.dispose()
    table = lake.catalog().load_table(table_name)
    assert table.location().startswith(f"{seaweed.warehouse}/")
    snapshots = table.snapshots()
    assert len(snapshots) == 1 and snapshots[0].summary is not None
    assert snapshots[0].summary["exactly-once.write-id"] == write_id
    assert independent_reader.read_rows(table, "id, name") == sorted(
        (r["id"], r["name"]) for r in rows.select(["id", "name"]).to_pylist()
    )

    # -- every place the run left text in --------------------------------------------------------
    # dag.test() runs every task in this process: its task logs are this process's output (captured
    # at the file descriptors, spark-submit's lines included); any log file Airflow wrote is read too.
    places: dict[str, str] = {"captured stdout": captured.out, "captured stderr": captured.err}
    log_files = [p for p in (airflow_home / "logs").rglob("*") if p.is_file() and f"dag_id={dag.dag_id}" in str(p)]
    places.update({f"log {p}": p.read_text(errors="replace") for p in log_files})
    task_logs = "\n".join(text for name, text in places.items())
    # What is grepped is the run's real output: the write's own log lines are in it.
    assert write_id in task_logs and "spark-submit" in task_logs.lower(), sorted(places)

    rendered = rendered_fields(dag.dag_id, dr.run_id)
    ran = {task for task, (state, _) in states.items() if state != "skipped"}
    assert set(rendered) == ran, rendered  # every task that ran has its rendered fields stored
    assert lake.landing in rendered["write"]  # the write's templated input, rendered
    places.update({f"rendered {task}": text for task, text in rendered.items()})

    xcoms = xcom_values(dag.dag_id, dr.run_id)
    assert {"write", f"{G}.persist", f"{G}.commit"} <= {task for task, _ in xcoms}, sorted(xcoms)
    assert write_id in xcoms[("write", "return_value")]
    places.update({f"xcom {task}/{key}": text for (task, key), text in xcoms.items()})

    meta = meta_store_rows(meta_url)
    assert any(write_id in text for text in meta.values()) and any(sink.sink_id in t for t in meta.values())
    assert any(name.startswith("sink_registry") or "registry" in name for name in meta), sorted(meta)
    places.update({f"meta store {name}": text for name, text in meta.items()})

    places.update(eo_sink_outputs(meta_conn_id, sink.sink_id))
    assert write_id in places["eo-sink show --json"]

    places.update(ui_answers(meta_url, meta_conn_id, sink.sink_id, monkeypatch))
    assert write_id in places[f"ui /api/sinks/{sink.sink_id}/epochs/{EPOCH}"]

    # The secret looked for is the one the run used: it is in the connections it was given.
    given = {
        f"AIRFLOW_CONN_{c.upper()}": os.environ[f"AIRFLOW_CONN_{c.upper()}"]
        for c in (meta_conn_id, iceberg_conn_id, storage_conn_id)
    }
    assert set(leaks(SECRET_KEY, given)) == {
        f"AIRFLOW_CONN_{iceberg_conn_id.upper()}",
        f"AIRFLOW_CONN_{storage_conn_id.upper()}",
    }
    assert leaks(SECRET_KEY, places) == [], {name: snippet(places[name]) for name in leaks(SECRET_KEY, places)}


def snippet(text: str, secret: str = SECRET_KEY, width: int = 200) -> str:
    at = text.find(secret)
    return text[max(0, at - width) : at + len(secret) + width]


def rendered_fields(dag_id: str, run_id: str) -> dict[str, str]:
    """task id -> the JSON of its stored rendered template fields (the UI's "Rendered Templates")."""
    from airflow.models.renderedtifields import RenderedTaskInstanceFields as RTIF
    from airflow.utils.session import create_session

    with create_session() as session:
        stored = session.scalars(sa.select(RTIF).where(RTIF.dag_id == dag_id, RTIF.run_id == run_id)).all()
        return {r.task_id: json.dumps(r.rendered_fields, default=str) + json.dumps(r.k8s_pod_yaml) for r in stored}


def xcom_values(dag_id: str, run_id: str) -> dict[tuple[str, str], str]:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        stored = session.execute(
            sa.select(XComModel.task_id, XComModel.key, XComModel.value).where(
                XComModel.dag_id == dag_id, XComModel.run_id == run_id
            )
        ).all()
    out: dict[tuple[str, str], str] = {}
    for task_id, key, value in stored:
        decoded = value
        if isinstance(value, str | bytes):
            try:
                decoded = json.loads(value)
            except ValueError:  # a plain string value
                decoded = value if isinstance(value, str) else value.decode(errors="replace")
        out[(task_id, key)] = expand(decoded) + "\n" + expand(json.dumps(decoded, default=str))
    return out


def meta_store_rows(url: str) -> dict[str, str]:
    """table name -> every row of every table of the meta store, as text."""
    engine = sa.create_engine(url)
    try:
        metadata = sa.MetaData()
        metadata.reflect(engine)
        out: dict[str, str] = {}
        with engine.connect() as conn:
            for name, table in metadata.tables.items():
                lines = [
                    "\t".join(expand(v) if isinstance(v, str) else str(v) for v in row)
                    for row in conn.execute(sa.select(table))
                ]
                out[name] = "\n".join(lines)
        return out
    finally:
        engine.dispose()


def eo_sink_outputs(meta_conn_id: str, sink_id: str) -> dict[str, str]:
    """``eo-sink`` as a script (the installed console script), through the meta store connection."""
    assert EO_SINK.exists(), f"{EO_SINK} is missing: run `uv sync --frozen` to install the project's scripts"
    out: dict[str, str] = {}
    for args in (["status"], ["show", sink_id, str(EPOCH)], ["epochs", sink_id]):
        done = subprocess.run(
            [str(EO_SINK), *args, "--meta-conn-id", meta_conn_id, "--json"],
            capture_output=True,
            text=True,
            timeout=300,
            env=dict(os.environ),
        )
        name = f"eo-sink {args[0]} --json"
        assert done.returncode == 0, (args, done.stderr[-3000:])
        assert json.loads(done.stdout)  # real answers, not empty ones
        out[name] = done.stdout + done.stderr
    return out


def ui_answers(meta_url: str, meta_conn_id: str, sink_id: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The sink-state view's JSON API, in process: the plugin's own FastAPI app on this meta store,
    Airflow's SimpleAuthManager deciding access for an admin (the bearer-token check is the API
    server's and is left out: what is looked at is what the API answers)."""
    from airflow.api_fastapi.app import _AuthManagerState, create_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    from fastapi.testclient import TestClient

    from airflow_provider_exactly_once.operations import SinkOperations
    from airflow_provider_exactly_once.plugins.ui.app import create_app
    from airflow_provider_exactly_once.plugins.ui.security import current_user

    monkeypatch.setattr(_AuthManagerState, "instance", None)
    manager = create_auth_manager()
    manager.init()
    store = SqlSinkStateStore(meta_url)
    try:
        app = create_app(lambda: SinkOperations(store, meta_conn_id=meta_conn_id))
        app.dependency_overrides[current_user] = lambda: SimpleAuthManagerUser(username="admin", role="admin")
        out: dict[str, str] = {}
        with TestClient(app) as client:
            for path in ("/api/sinks", f"/api/epochs?sink={sink_id}", f"/api/sinks/{sink_id}/epochs/{EPOCH}"):
                response = client.get(path)
                assert response.status_code == 200, (path, response.text)
                assert response.json(), path
                out[f"ui {path}"] = response.text
            page = client.get(f"/sinks/{sink_id}/epochs/{EPOCH}")
            assert page.status_code == 200, page.text
            out["ui epoch page"] = page.text
        return out
    finally:
        store.dispose()


# -- SigV4 ------------------------------------------------------------------------------------------


def test_a_sigv4_signed_rest_catalog_connection_commits_an_epoch(
    airflow_home: Path, lake: Lake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ``iceberg`` connection with ``rest.sigv4-enabled``: no OAuth2 client, every catalog
    request signed with the S3 keys of the extra; persist and commit through the coordinator the
    tasks assemble (``runtime.assembly.coordinator_for``)."""
    from airflow_provider_exactly_once.core.epochs import CheckpointStatus
    from airflow_provider_exactly_once.core.outcomes import CommitOutcome
    from airflow_provider_exactly_once.operators.spark_precommit import iceberg_catalog_properties
    from airflow_provider_exactly_once.runtime.assembly import coordinator_for
    from tests.support.object_store import S3Pipeline, seaweed_lake

    seaweed = lake.seaweed
    no_ambient_credentials(monkeypatch)
    conn_id = f"sigv4_{uuid.uuid4().hex[:8]}"
    extra = {
        "type": "rest",
        "warehouse": seaweed.warehouse,
        "rest.sigv4-enabled": "true",
        "rest.signing-name": "s3tables",
        "rest.signing-region": REGION,
        "client.access-key-id": ACCESS_KEY,
        "client.secret-access-key": SECRET_KEY,
        "client.region": REGION,
        "s3.endpoint": seaweed.s3_endpoint,
    }
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{conn_id.upper()}",
        json.dumps({"conn_type": "iceberg", "host": seaweed.catalog_uri, "extra": extra}),
    )
    # The files are written as the Spark writer writes them (footer-described Parquet on S3).
    writer = S3Pipeline(
        meta_url=f"sqlite:///{tmp_path / 'meta.db'}",
        catalog_url=seaweed.catalog_uri,
        warehouse=tmp_path,
        catalog_name=conn_id,
        namespace=lake.namespace,
        lake=seaweed_lake(seaweed, lake.namespace),
    )
    try:
        writer.create_table("orders")
        sink = IcebergSinkConfig("orders-sigv4", (f"{lake.namespace}.orders",), iceberg_conn_id=conn_id)
        pre = writer.write_iceberg(sink.sink_id, EPOCH, ["orders"], 25)
        coordinator = coordinator_for(sink, None, store=writer.store)
        # What the Spark writer's driver gets from the same connection: signed, no OAuth2 client.
        properties = iceberg_catalog_properties(conn_id)
        assert properties["rest.sigv4-enabled"] == "true" and "credential" not in properties
        coordinator.persist(pre)
        writer.store.checkpoints.set_checkpoint(sink.sink_id, EPOCH, CheckpointStatus.COMPLETED)
        assert coordinator.commit(sink.sink_id, EPOCH).outcome is CommitOutcome.COMMITTED
        table = lake.catalog().load_table(f"{lake.namespace}.orders")
        assert [s.summary["exactly-once.write-id"] for s in table.snapshots() if s.summary] == [pre.write_id]
        assert len(independent_reader.read_rows(table, "id")) == 25
    finally:
        writer.dispose()


def test_a_wrong_sigv4_secret_is_refused_by_the_catalog(lake: Lake) -> None:
    """The signature is checked: SigV4 above is not a catalog that lets anyone in."""
    seaweed = lake.seaweed
    catalog = load_catalog(
        "sigv4_wrong",
        type="rest",
        uri=seaweed.catalog_uri,
        warehouse=seaweed.warehouse,
        **{
            "rest.sigv4-enabled": "true",
            "rest.signing-name": "s3tables",
            "rest.signing-region": REGION,
            "client.access-key-id": ACCESS_KEY,
            "client.secret-access-key": "not-the-secret",
            "client.region": REGION,
        },
    )
    with pytest.raises(Exception) as refused:
        catalog.list_tables(lake.namespace)
    assert "403" in str(refused.value) or "401" in str(refused.value) or "Forbidden" in type(refused.value).__name__, (
        refused.value
    )
