"""``eo-sink`` reads the meta-store connection as Airflow's server processes do, without Airflow.

Each case is set up for real: an Airflow database migrated by ``airflow db migrate``, connections
added through Airflow's own model (so encrypted with the Fernet key as the UI would), environment
connections, a secrets backend Airflow ships. Airflow's answer is the hook's, in a fresh interpreter
(its configuration is per process); ``cli.meta_connection.resolve`` must give the same answer or
decline (``None``), and must not decline where it promises speed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet

from airflow_provider_exactly_once.cli import meta_connection
from airflow_provider_exactly_once.core.errors import InvalidSinkConfig
from airflow_provider_exactly_once.core.precommit import PreCommit, TableWrite
from airflow_provider_exactly_once.store import SqlSinkStateStore

ROOT = Path(__file__).resolve().parents[2]
FERNET_KEY = Fernet.generate_key().decode()
#: An environment value that removes the variable.
UNSET = "<unset>"

#: Adds the connections of the cases through Airflow's model (argv[1]: JSON list of fields).
ADD = """
import json, sys
from airflow.models.connection import Connection
from airflow.utils.session import create_session
with create_session() as session:
    for fields in json.loads(sys.argv[1]):
        session.add(Connection(**fields))
"""
#: Airflow's answer: the hook in a server process's chain (argv[1]: the connection id or "").
ASK_AIRFLOW = """
import json, sys
from airflow_provider_exactly_once.core.errors import InvalidSinkConfig
from airflow_provider_exactly_once.hooks.meta_store import ExactlyOnceMetaStoreHook
from airflow_provider_exactly_once.runtime.assembly import meta_conn_id_or_configured
from airflow_provider_exactly_once.upstream_private import as_airflow_server_process
with as_airflow_server_process():
    conn_id = meta_conn_id_or_configured(sys.argv[1] or None)
    try:
        url, options = ExactlyOnceMetaStoreHook(conn_id).get_url()
        print(json.dumps([conn_id, url, options]))
    except InvalidSinkConfig as exc:
        print(json.dumps(["refused", str(exc)]))
"""


def _clean_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "_AIRFLOW"))}
    env.update({"AIRFLOW_HOME": str(home), "AIRFLOW__CORE__FERNET_KEY": FERNET_KEY, "PYTHONPATH": str(ROOT), **extra})
    return {k: v for k, v in env.items() if v != UNSET}


def _python(code: str, env: dict[str, str], *args: str) -> str:
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.fixture(scope="module")
def airflow_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An Airflow home migrated by Airflow's CLI, holding the cases' connections in its database."""
    home = tmp_path_factory.mktemp("airflow-home")
    env = _clean_env(home)
    migrated = subprocess.run(
        [str(Path(sys.executable).parent / "airflow"), "db", "migrate"], capture_output=True, text=True, env=env
    )
    assert migrated.returncode == 0, migrated.stderr[-3000:]
    connections = [
        {"conn_id": "exactly_once_default", "conn_type": "exactly_once_meta", "host": f"sqlite:///{home}/in-db.db"},
        {
            "conn_id": "meta_pw",
            "conn_type": "exactly_once_meta",
            "host": "postgresql+psycopg2://eo@db.example:5432/meta",
            "password": "p@ss:w/rd%",
            "extra": json.dumps({"connect_timeout_s": 3, "busy_timeout_s": "7.5"}),
        },
        {"conn_id": "meta_no_url", "conn_type": "exactly_once_meta", "host": ""},
    ]
    _python(ADD, env, json.dumps(connections))
    return home


def _answers(monkeypatch: pytest.MonkeyPatch, home: Path, conn_id: str | None, **env: str) -> tuple[Any, Any]:
    """(ours, Airflow's) for one set-up."""
    for key in list(os.environ):
        if key.startswith(("AIRFLOW", "_AIRFLOW")):
            monkeypatch.delenv(key)
    for key, value in _clean_env(home, **env).items():
        monkeypatch.setenv(key, value)
    try:
        resolved = meta_connection.resolve(conn_id)
        ours: Any = None if resolved is None else [resolved[0], resolved[1], resolved[2]]
    except InvalidSinkConfig as exc:
        ours = ["refused", str(exc)]
    theirs = json.loads(_python(ASK_AIRFLOW, _clean_env(home, **env), conn_id or "").strip().splitlines()[-1])
    return ours, theirs


CASES: dict[str, tuple[str | None, dict[str, str]]] = {
    "the default id, in Airflow's database, encrypted": (None, {}),
    "a password field and an encrypted extra": ("meta_pw", {}),
    "the configured id": (None, {"AIRFLOW__EXACTLY_ONCE__META_CONN_ID": "meta_pw"}),
    "a JSON environment connection before the database's": (
        None,
        {
            "AIRFLOW_CONN_EXACTLY_ONCE_DEFAULT": json.dumps(
                {"conn_type": "exactly_once_meta", "host": "sqlite:////e.db"}
            )
        },
    ),
    "a connection without a URL": ("meta_no_url", {}),
    "an id that exists nowhere": ("nowhere", {}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_cli_reads_what_airflow_reads_without_airflow(
    case: str, airflow_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conn_id, env = CASES[case]
    ours, theirs = _answers(monkeypatch, airflow_home, conn_id, **env)
    assert ours is not None, f"{case}: the CLI asked Airflow where it promises to answer alone"
    assert ours == theirs


def test_without_an_airflow_database_the_default_id_is_the_embedded_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ours, theirs = _answers(monkeypatch, tmp_path, None)
    assert ours == theirs == ["exactly_once_default", f"sqlite:///{tmp_path}/exactly_once/meta.db", {}]


DECLINED: dict[str, dict[str, str]] = {
    "a secrets backend": {
        "AIRFLOW__SECRETS__BACKEND": "airflow.secrets.local_filesystem.LocalFilesystemBackend",
        "AIRFLOW__SECRETS__BACKEND_KWARGS": "CONNECTIONS_FILE",
    },
    "a URI environment connection": {},
    "a Fernet key given by a command": {
        "AIRFLOW__CORE__FERNET_KEY": UNSET,
        "AIRFLOW__CORE__FERNET_KEY_CMD": f"echo {FERNET_KEY}",
    },
}


@pytest.mark.parametrize("case", list(DECLINED))
def test_what_the_cli_cannot_read_as_airflow_does_is_left_to_airflow(
    case: str, airflow_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = dict(DECLINED[case])
    if case == "a secrets backend":  # a file of connections Airflow ships a backend for, searched first
        path = tmp_path / "connections.json"
        path.write_text(json.dumps({"exactly_once_default": {"conn_type": "x", "host": "sqlite:////from-file.db"}}))
        env["AIRFLOW__SECRETS__BACKEND_KWARGS"] = json.dumps({"connections_file_path": str(path)})
    if case == "a URI environment connection":
        env["AIRFLOW_CONN_EXACTLY_ONCE_DEFAULT"] = "exactly-once-meta://u:pw@db.example:5432/meta"
    # meta_pw's password is encrypted: the key is needed
    ours, theirs = _answers(monkeypatch, airflow_home, "meta_pw" if "KEY_CMD" in str(env) else None, **env)
    assert ours is None
    assert theirs[0] in ("exactly_once_default", "meta_pw", "refused")
    if case == "a secrets backend":
        assert theirs[1] == "sqlite:////from-file.db"


def test_eo_sink_status_reads_the_store_of_a_connection_made_in_airflows_database(
    airflow_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection made in the UI (Airflow's database) is the one ``eo-sink`` reads, through the
    command as an operator runs it, not the embedded store beside it."""
    store = SqlSinkStateStore(f"sqlite:///{airflow_home}/in-db.db")
    try:
        pre = PreCommit(
            sink_id="in-db-sink",
            epoch=3_600_000,
            write_id="00000000-0000-4000-8000-000000000001",
            tables=[TableWrite(table="ns.t", location="file:///tmp/in-db/1")],
        )
        store.insert_pending(pre, run_id="scheduled__1", try_number=1, dag_id="d")
    finally:
        store.dispose()
    run = "import sys; from airflow_provider_exactly_once.cli.main import main; sys.exit(main())"
    out = _python(run, _clean_env(airflow_home), "status", "--json")
    assert [s["sink_id"] for s in json.loads(out)["sinks"]] == ["in-db-sink"]
