"""Which meta store ``eo-sink`` opens, as an operator runs it: the installed script, a fresh process each.

Without ``--url`` or ``EO_SINK_URL`` it asks Airflow for the meta-store connection as Airflow's
server processes do: a secrets backend first, then ``AIRFLOW_CONN_<ID>`` (JSON or URI), then
Airflow's database. Each place is set up for real in an Airflow home migrated by ``airflow db
migrate``: connections added through Airflow's model (encrypted with the home's Fernet key, as the
UI does), Airflow's ``LocalFilesystemBackend`` configured in the home's ``airflow.cfg``. Each
connection names a meta store of its own holding one sink, so the sink listed says which was read.
With a URL given, nothing of Airflow is imported (docs/design.md, D20).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_provider_exactly_once.core.precommit import PreCommit, TableWrite
from airflow_provider_exactly_once.store import SqlSinkStateStore
from tests.cli.test_eo_sink import EO_SINK

#: Adds connections through Airflow's model, as the UI does (argv[1]: a JSON list of their fields).
ADD = """
import json, sys
from airflow.models.connection import Connection
from airflow.utils.session import create_session
with create_session() as session:
    for fields in json.loads(sys.argv[1]):
        session.add(Connection(**fields))
"""
#: A connection's URI as Airflow writes it (argv[1]: its SQLAlchemy URL).
URI_OF = """
import sys
from airflow.models.connection import Connection
print(Connection(conn_id="x", conn_type="exactly_once_meta", host=sys.argv[1]).get_uri())
"""
#: ``eo-sink`` in this process, then the Airflow modules it imported, on the last line of stderr.
RUN_AND_LIST_AIRFLOW = """
import json, sys
from airflow_provider_exactly_once.cli.main import main
code = main()
airflow = sorted(name for name in sys.modules if name == "airflow" or name.startswith("airflow."))
print(json.dumps(airflow), file=sys.stderr)
sys.exit(code)
"""


def _env(home: Path, **extra: str) -> dict[str, str]:
    """This machine's environment without the test suite's Airflow settings, in ``home``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "_AIRFLOW", "EO_SINK"))}
    return {**env, "AIRFLOW_HOME": str(home), **extra}


def _python(code: str, env: dict[str, str], *args: str) -> str:
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _store_with_sink(path: Path, sink_id: str) -> str:
    """A meta store at ``path`` whose one sink is ``sink_id``; its URL."""
    url = f"sqlite:///{path}"
    store = SqlSinkStateStore(url)
    try:
        pre = PreCommit(
            sink_id=sink_id,
            epoch=3_600_000,
            write_id="00000000-0000-4000-8000-000000000001",
            tables=[TableWrite(table="ns.t", location=f"file:///tmp/{sink_id}/1")],
        )
        store.insert_pending(pre, run_id="scheduled__1", try_number=1, dag_id="d")
    finally:
        store.dispose()
    return url


def _sinks(args: list[str], env: dict[str, str]) -> list[str]:
    done = subprocess.run(
        [str(EO_SINK), "status", "--json", *args], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr == "", "asking Airflow is as quiet as reading a URL"
    return [s["sink_id"] for s in json.loads(done.stdout)["sinks"]]


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An Airflow home migrated by Airflow's CLI: the default connection, ``eo_env`` and
    ``eo_everywhere`` in its database, ``eo_everywhere`` also in a connections file its
    ``airflow.cfg`` names as the secrets backend, to a store of its own."""
    home = tmp_path_factory.mktemp("airflow-home")
    migrated = subprocess.run(
        [str(Path(sys.executable).parent / "airflow"), "db", "migrate"],
        capture_output=True,
        text=True,
        env=_env(home),
        timeout=600,
    )
    assert migrated.returncode == 0, migrated.stderr[-3000:]
    stores = {name: _store_with_sink(home / f"{name}.db", f"from-{name}") for name in ("db", "db-shadowed", "file")}
    connections = [
        {"conn_id": "exactly_once_default", "conn_type": "exactly_once_meta", "host": stores["db"]},
        {"conn_id": "eo_everywhere", "conn_type": "exactly_once_meta", "host": stores["db-shadowed"]},
        {"conn_id": "eo_env", "conn_type": "exactly_once_meta", "host": stores["db-shadowed"]},
    ]
    _python(ADD, _env(home), json.dumps(connections))
    connections_file = home / "connections.json"
    connections_file.write_text(
        json.dumps({"eo_everywhere": {"conn_type": "exactly_once_meta", "host": stores["file"]}})
    )
    config = home / "airflow.cfg"
    text = config.read_text()
    secrets = text.index("\n[secrets]\n")
    backend = json.dumps({"connections_file_path": str(connections_file)})
    section = (
        text[secrets:]
        .replace("\nbackend = \n", "\nbackend = airflow.secrets.local_filesystem.LocalFilesystemBackend\n", 1)
        .replace("\nbackend_kwargs = \n", f"\nbackend_kwargs = {backend}\n", 1)
    )
    assert section != text[secrets:], "airflow.cfg has no empty [secrets] backend to configure"
    config.write_text(text[:secrets] + section)
    return home


def test_a_connection_in_airflows_database(home: Path) -> None:
    """The default id, made as the UI makes it (its row encrypted): the connection the tasks use."""
    assert _sinks([], _env(home)) == ["from-db"]


def test_a_secrets_backend_before_airflows_database(home: Path) -> None:
    """``eo_everywhere`` is in the connections file and in the database: Airflow's server processes
    search the configured backend first, and so does ``eo-sink``."""
    assert _sinks(["--meta-conn-id", "eo_everywhere"], _env(home)) == ["from-file"]


@pytest.mark.parametrize("form", ["JSON", "URI"])
def test_an_environment_connection_before_airflows_database(home: Path, tmp_path: Path, form: str) -> None:
    """``AIRFLOW_CONN_EO_ENV``, in either form Airflow reads, wins over the database's ``eo_env``."""
    url = _store_with_sink(tmp_path / "env.db", f"from-env-{form.lower()}")
    if form == "JSON":
        value = json.dumps({"conn_type": "exactly_once_meta", "host": url})
    else:
        value = _python(URI_OF, _env(home), url).strip().splitlines()[-1]
        assert value.startswith("exactly-once-meta://"), value
    assert _sinks(["--meta-conn-id", "eo_env"], _env(home, AIRFLOW_CONN_EO_ENV=value)) == [f"from-env-{form.lower()}"]


@pytest.mark.parametrize(
    "command",
    [["status"], ["epochs"], ["show", "from-url", "3600000"], ["history", "from-url", "3600000"]],
    ids=" ".join,
)
@pytest.mark.parametrize("given", ["--url", "EO_SINK_URL"])
def test_a_url_given_imports_nothing_of_airflow(home: Path, tmp_path: Path, command: list[str], given: str) -> None:
    """``--url`` or ``EO_SINK_URL``: the store named, read without importing any module of Airflow
    (the home's own connection, the secrets backend and a connection in the environment are ignored)."""
    url = _store_with_sink(tmp_path / "given.db", "from-url")
    env = _env(home, AIRFLOW_CONN_EXACTLY_ONCE_DEFAULT=json.dumps({"conn_type": "exactly_once_meta", "host": "x"}))
    argv = [*command, "--json"]
    if given == "--url":
        argv += ["--url", url]
    else:
        env[given] = url
    done = subprocess.run(
        [sys.executable, "-c", RUN_AND_LIST_AIRFLOW, *argv], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "from-url" in done.stdout
    assert json.loads(done.stderr.strip().splitlines()[-1]) == []


def test_meta_conn_id_wins_over_eo_sink_url(home: Path, tmp_path: Path) -> None:
    """The command line says more than the environment: ``--meta-conn-id`` asks Airflow even with
    ``EO_SINK_URL`` set."""
    env = _env(home, EO_SINK_URL=_store_with_sink(tmp_path / "env-url.db", "from-env-url"))
    assert _sinks([], env) == ["from-env-url"]
    assert _sinks(["--meta-conn-id", "exactly_once_default"], env) == ["from-db"]


def test_a_bad_eo_sink_url_is_a_usage_error_naming_it(home: Path) -> None:
    done = subprocess.run(
        [str(EO_SINK), "status"],
        capture_output=True,
        text=True,
        env=_env(home, EO_SINK_URL="postgresql://eo:Secret1@db:notaport/x"),
        timeout=300,
    )
    assert done.returncode == 2
    assert "EO_SINK_URL 'postgresql://eo:***@db:notaport/x' is not a SQLAlchemy URL" in done.stderr
    assert "Secret1" not in done.stderr + done.stdout
