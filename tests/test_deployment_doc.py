"""docs/deployment.md's Iceberg connections, tested as written: the ``export AIRFLOW_CONN_...='...'``
lines of its REST catalog and Glue sections are run by bash with the placeholders replaced by the
local servers' values (SeaweedFS for REST, moto for Glue), and the connection Airflow reads from
that variable loads the catalog and commits an epoch: persist and commit through the coordinator
the tasks assemble (``runtime.assembly.coordinator_for``: the committer's catalog from
``IcebergHook``), the files written with the catalog properties the Spark writer gets from the
same connection (``operators.spark_precommit.iceberg_catalog_properties``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import uuid
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_exactly_once.core.epochs import CheckpointStatus, EpochStatus
from airflow_provider_exactly_once.core.outcomes import CommitOutcome
from airflow_provider_exactly_once.operators.spark_precommit import iceberg_catalog_properties
from airflow_provider_exactly_once.runtime.assembly import coordinator_for
from airflow_provider_exactly_once.sinks.config import IcebergSinkConfig
from demo.servers import ACCESS_KEY, SECRET_KEY, MotoServer, SeaweedFS
from tests.support.independent_reader import read_rows
from tests.support.object_store import FSSPEC_IO, Lake, S3Pipeline

DOC = Path(__file__).resolve().parents[1] / "docs" / "deployment.md"
REST_SECTION = "### REST catalog"
GLUE_SECTION = "### AWS Glue"
EPOCH = 1_704_067_200_000


def section(heading: str) -> str:
    """The text of the section that starts with ``heading``, up to the next heading of any level."""
    text = DOC.read_text(encoding="utf-8")
    start = next((m.start() for m in re.finditer(rf"^{re.escape(heading)}", text, re.MULTILINE)), None)
    assert start is not None, f"docs/deployment.md has no section {heading!r}"
    end = re.compile(r"^#{1,3} ", re.MULTILINE).search(text, start + len(heading))
    return text[start : end.start() if end else len(text)]


def bash_blocks(text: str) -> list[str]:
    return re.findall(r"^```bash\n(.*?)^```", text, re.MULTILINE | re.DOTALL)


def exported_connection(heading: str, placeholders: Mapping[str, str]) -> tuple[str, str]:
    """(connection id, value): the section's one ``export AIRFLOW_CONN_...`` block, placeholders
    replaced, run by bash; the value is what the variable holds afterwards, as a worker would see it."""
    [block] = [b for b in bash_blocks(section(heading)) if "AIRFLOW_CONN_" in b]
    names = re.findall(r"^export (AIRFLOW_CONN_[A-Z0-9_]+)=", block, re.MULTILINE)
    assert len(names) == 1, block
    for placeholder, value in placeholders.items():
        assert placeholder in block, f"{heading}: the example no longer has {placeholder!r}"
        block = block.replace(placeholder, value)
    assert not re.search(r"<[^<>]*>", block), f"{heading}: a placeholder is left: {block}"
    shown = subprocess.run(
        ["bash", "-c", f'{block}\nprintf %s "${names[0]}"'],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
        env={"PATH": os.environ.get("PATH", "")},
    )
    return names[0].removeprefix("AIRFLOW_CONN_").lower(), shown.stdout


def test_the_doc_has_one_connection_example_per_section_and_each_is_json() -> None:
    """The parsing the other tests rely on: blocks found, the value valid JSON of type ``iceberg``."""
    for heading in (REST_SECTION, GLUE_SECTION):
        [block] = [b for b in bash_blocks(section(heading)) if "AIRFLOW_CONN_" in b]
        [value] = re.findall(r"^export AIRFLOW_CONN_[A-Z0-9_]+='(.*)'$", block, re.MULTILINE)
        assert json.loads(value)["conn_type"] == "iceberg"
    with pytest.raises(AssertionError, match="no longer has"):
        exported_connection(REST_SECTION, {"<no such placeholder>": "x"})


@pytest.fixture
def no_ambient_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """What reaches the catalog and S3 does so with the connection's keys alone."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def commit_an_epoch(conn_id: str, lake: Lake, namespace: str, tmp_path: Path) -> None:
    """A table, a write of its files, then persist and commit as the tasks do; read back by DuckDB."""
    pipeline = S3Pipeline(
        meta_url=f"sqlite:///{tmp_path / f'meta-{uuid.uuid4().hex[:6]}.db'}",
        catalog_url=lake.catalog_properties.get("uri", lake.s3_endpoint),
        warehouse=tmp_path,
        catalog_name=conn_id,
        namespace=namespace,
        lake=lake,
    )
    try:
        table = pipeline.create_table("orders")
        sink = IcebergSinkConfig(f"doc-{uuid.uuid4().hex[:8]}", (f"{namespace}.orders",), iceberg_conn_id=conn_id)
        pre = pipeline.write_iceberg(sink.sink_id, EPOCH, ["orders"], rows=11, files=2)
        coordinator = coordinator_for(sink, None, store=pipeline.store)
        coordinator.persist(pre)
        pipeline.checkpoint(sink.sink_id, EPOCH, CheckpointStatus.COMPLETED)
        assert coordinator.commit(sink.sink_id, EPOCH).outcome is CommitOutcome.COMMITTED
        row = pipeline.store.get(sink.sink_id, EPOCH)
        assert row is not None and row.status is EpochStatus.COMMITTED
        committed = pipeline.catalog.load_table(f"{namespace}.orders")
        assert committed.location() == table.location()
        assert sorted(read_rows(committed, "id, epoch, write_id")) == pipeline.expected_rows(
            [pre], f"{namespace}.orders"
        )
    finally:
        pipeline.dispose()


@pytest.mark.parametrize("file_io", ["pyarrow", "fsspec"])
def test_the_rest_catalog_connection_of_the_doc_commits_an_epoch(
    seaweed: SeaweedFS,
    file_io: str,
    unique: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    no_ambient_credentials: None,
    airflow_home: Path,
) -> None:
    name, value = exported_connection(
        REST_SECTION,
        {
            "http://catalog:8181": seaweed.catalog_uri,
            "<client id>": ACCESS_KEY,
            "<client secret>": SECRET_KEY,
            "s3://lake": seaweed.warehouse,
            "http://s3:8333": seaweed.s3_endpoint,
            "<key id>": ACCESS_KEY,
            "<secret>": SECRET_KEY,
        },
    )
    conn = json.loads(value)
    if file_io == "fsspec":  # "Add "py-io-impl": ... to use s3fs instead of pyarrow's S3 client"
        conn["extra"].update(FSSPEC_IO)
    conn_id = f"{name}_{unique}"  # the doc's id, once per test: connections are cached per process
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(conn))

    properties = iceberg_catalog_properties(conn_id)
    # "IcebergHook turns host into uri and login:password into the REST credential"
    assert properties["uri"] == seaweed.catalog_uri
    assert properties["oauth2-server-uri"] == f"{seaweed.catalog_uri}/v1/oauth/tokens"
    assert properties["credential"] == f"{ACCESS_KEY}:{SECRET_KEY}"
    assert properties["type"] == "rest" and properties["warehouse"] == seaweed.warehouse
    namespace = f"doc_{unique}"
    lake = Lake("rest", properties, seaweed.s3fs_options(), seaweed.s3_endpoint, namespace)
    assert name == "iceberg_default"

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        commit_an_epoch(conn_id, lake, namespace, tmp_path)
    # The example names its token endpoint: no reliance on pyiceberg's deprecated fallback.
    assert not [w for w in caught if "OAuth2 server URI" in str(w.message)]
    table = lake.catalog().load_table(f"{namespace}.orders")
    assert type(table.io).__name__ == lake.file_io


def test_the_glue_connection_of_the_doc_commits_an_epoch(
    moto: MotoServer,
    unique: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    no_ambient_credentials: None,
    airflow_home: Path,
) -> None:
    name, value = exported_connection(GLUE_SECTION, {})
    conn: dict[str, Any] = json.loads(value)
    extra = conn["extra"]
    # "outside AWS add glue.access-key-id, glue.secret-access-key, s3.access-key-id,
    # s3.secret-access-key, and glue.endpoint / s3.endpoint for an S3-compatible store"
    extra.update(
        {
            "glue.access-key-id": ACCESS_KEY,
            "glue.secret-access-key": SECRET_KEY,
            "s3.access-key-id": ACCESS_KEY,
            "s3.secret-access-key": SECRET_KEY,
            "glue.endpoint": moto.endpoint,
            "s3.endpoint": moto.endpoint,
        }
    )
    conn_id = f"{name}_{unique}"
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(conn))

    properties = iceberg_catalog_properties(conn_id)
    assert properties["type"] == "glue" and "credential" not in properties and "uri" not in properties
    namespace = f"doc_{unique}"
    lake = Lake("glue", properties, moto.s3fs_options(), moto.endpoint, namespace)

    commit_an_epoch(conn_id, lake, namespace, tmp_path)
    # "Tables are created under <warehouse>/<namespace>.db/<table>"
    table = lake.catalog().load_table(f"{namespace}.orders")
    assert table.location() == f"{extra['warehouse']}/{namespace}.db/orders"
