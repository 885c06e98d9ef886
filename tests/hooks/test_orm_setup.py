"""Opening the meta store in a task process does not make Airflow import every one of its models.

Run in fresh interpreters: the listener at stake fires once per process, and this test session has
long configured Airflow's mappers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

OPEN_AND_QUERY = """
import json, sys
import airflow.sdk  # what a task process has
from airflow_provider_exactly_once.hooks.meta_store import ExactlyOnceMetaStoreHook
store = ExactlyOnceMetaStoreHook("eo_meta").get_store()
store.registry.register_sink("s", {"kind": "files", "sink_id": "s", "root": "/x"}, None)  # an ORM query
loaded = "airflow.models.taskinstancehistory" in sys.modules
store.dispose()
"""


def _run(code: str, tmp_path: Path) -> list[object]:
    env_conn = json.dumps({"conn_type": "exactly_once_meta", "host": f"sqlite:///{tmp_path / 'meta.db'}"})
    catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path / 'catalog.db'}", "warehouse": f"file://{tmp_path}"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")},
            "AIRFLOW_HOME": str(tmp_path / "home"),
            "AIRFLOW_CONN_EO_META": env_conn,
            "AIRFLOW_CONN_LAKE": json.dumps({"conn_type": "iceberg", "extra": catalog}),
        },
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_the_stores_first_query_leaves_airflows_models_unimported(tmp_path: Path) -> None:
    code = OPEN_AND_QUERY + "print(json.dumps([loaded]))\n"
    assert _run(code, tmp_path) == [False]


def test_airflows_own_mappers_still_import_every_model_when_they_are_configured(tmp_path: Path) -> None:
    """Airflow's listener is put back: configuring its mappers afterwards imports its models, and
    mappers whose relationships name other models resolve."""
    code = OPEN_AND_QUERY + (
        "from sqlalchemy.orm import configure_mappers\n"
        "from airflow.models.dagrun import DagRun\n"
        "configure_mappers()\n"
        "print(json.dumps([loaded, 'airflow.models.taskinstancehistory' in sys.modules, "
        "DagRun.task_instances.property.mapper.class_.__name__]))\n"
    )
    assert _run(code, tmp_path) == [False, True, "TaskInstance"]


def test_a_sql_catalogs_first_query_leaves_airflows_models_unimported(tmp_path: Path) -> None:
    """pyiceberg's SQL catalog maps its tables with SQLAlchemy's ORM too: the committer's catalog
    configures them alone."""
    code = (
        "import json, sys\n"
        "import airflow.sdk\n"
        "from airflow_provider_exactly_once.runtime.assembly import sink_committer\n"
        "from airflow_provider_exactly_once.sinks.config import IcebergSinkConfig\n"
        "committer = sink_committer(IcebergSinkConfig('s', ('ns.t',), iceberg_conn_id='lake'))\n"
        "committer.catalog.create_namespace('ns')  # an ORM query of pyiceberg's\n"
        "print(json.dumps([committer.catalog.list_namespaces(), "
        "'airflow.models.taskinstancehistory' in sys.modules]))\n"
    )
    assert _run(code, tmp_path) == [[["ns"]], False]
