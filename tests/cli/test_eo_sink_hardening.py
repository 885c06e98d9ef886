"""``eo-sink`` as an attacker or a careless operator meets it: the installed script, as a subprocess.

Credentials planted in a file sink's root, its checkpoint path, an error text, an Iceberg catalog's
URI and ``--url``; a catalog that is down; numbers and durations past what a machine holds; terminal
escape sequences in what the meta store returns. Each gets a clear message and its exit code, never
a traceback, never the password, never a raw control character on the terminal.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import socket
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from airflow_provider_exactly_once.checkpoints.config import MetaStoreCheckpoint
from airflow_provider_exactly_once.cli.main import EXIT_FAILED, EXIT_OK, EXIT_USAGE, main
from airflow_provider_exactly_once.core.epochs import ABORT_REASON_MAX_LENGTH
from airflow_provider_exactly_once.core.precommit import PreCommit, TableWrite
from airflow_provider_exactly_once.operations import InvalidRequest, SinkOperations
from airflow_provider_exactly_once.sinks.config import IcebergSinkConfig
from tests.cli.test_eo_sink import EO_SINK, eo_sink, run_main
from tests.operations.helpers import coordinator, write
from tests.recovery.helpers import E1
from tests.support.airflow_world import World
from tests.support.builders import OPEN_RANGE, plant_stored_write, register_file_sink_with_root

EPOCH_MAX = 2**63 - 1
#: What a terminal must never receive raw from the tool: ESC, BEL, CR, the C1 CSI.
RAW_CONTROLS = re.compile(r"[\x07\x0d\x1b\x9b]")


@dataclass
class Planted:
    world: World
    password: str
    files_sink: str
    dead_sink: str
    dead_conn_id: str
    dead_uri: str
    rest_sink: str


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def planted(world: World, monkeypatch: pytest.MonkeyPatch) -> Iterator[Planted]:
    """A file sink registered (as before such roots were refused) with a password in its root and
    checkpoint path, an epoch of it whose error quotes the root, and two Iceberg sinks whose catalogs
    are down, their connections' URIs holding the same password: as userinfo, and as a REST
    catalog's ``token`` and a SAS ``sig`` in the query string."""
    password = f"Planted-{uuid.uuid4().hex}"
    store = world.pipeline.store
    files_sink, dead_sink = f"{world.sink_id}-files", f"{world.sink_id}-dead"
    root = f"s3://AKIAEXAMPLE:{password}@bucket/exports"
    pre = register_file_sink_with_root(store, files_sink, root, epoch=E1, dag_id="exports", run_id="scheduled__x")
    store.record_error(files_sink, E1, write_id=pre.write_id, error=f"SinkUnavailable: cannot list {root}/_eo/w1")

    dead_conn_id = f"iceberg_dead_{uuid.uuid4().hex[:8]}"
    dead_uri = f"postgresql+psycopg2://eo:{password}@127.0.0.1:{_closed_port()}/catalog"
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{dead_conn_id.upper()}",
        json.dumps({"conn_type": "iceberg", "extra": {"type": "sql", "uri": dead_uri}}),
    )
    dead = IcebergSinkConfig(dead_sink, (world.table,), iceberg_conn_id=dead_conn_id)
    store.registry.register_sink(dead_sink, dead.model_dump(mode="json"), MetaStoreCheckpoint().model_dump(mode="json"))
    dead_write = PreCommit(
        sink_id=dead_sink,
        epoch=E1,
        write_id=str(uuid.uuid4()),
        tables=[TableWrite(table=world.table, location=f"file://{world.tmp}/dead/_eo/w1")],
    )
    store.insert_pending(dead_write, run_id="scheduled__x", try_number=1, dag_id="hourly")

    rest_sink, rest_conn_id = f"{world.sink_id}-rest", f"iceberg_rest_{uuid.uuid4().hex[:8]}"
    rest_uri = f"http://127.0.0.1:{_closed_port()}/catalog?token={password}&sig={password}"
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{rest_conn_id.upper()}",
        json.dumps({"conn_type": "iceberg", "extra": {"type": "rest", "uri": rest_uri}}),
    )
    rest = IcebergSinkConfig(rest_sink, (world.table,), iceberg_conn_id=rest_conn_id)
    store.registry.register_sink(rest_sink, rest.model_dump(mode="json"), MetaStoreCheckpoint().model_dump(mode="json"))
    store.insert_pending(
        dead_write.model_copy(update={"sink_id": rest_sink}), run_id="scheduled__x", try_number=1, dag_id="hourly"
    )
    yield Planted(world, password, files_sink, dead_sink, dead_conn_id, dead_uri, rest_sink)


def _clean(result: object) -> None:
    """No traceback, and the tool's own last line says what went wrong."""
    stderr = getattr(result, "stderr", "")
    assert "Traceback" not in stderr, stderr
    assert "Traceback" not in getattr(result, "stdout", "")


@pytest.mark.parametrize("backend", ["sqlite"])
def test_no_output_of_any_command_holds_a_planted_password(planted: Planted) -> None:
    url, password = planted.world.pipeline.meta_url, planted.password
    runs = []
    for args in (
        ("status",),
        ("status", "--json"),
        ("status", planted.files_sink),
        ("epochs",),
        ("epochs", "--json"),
        ("show", planted.files_sink, str(E1)),
        ("show", planted.files_sink, str(E1), "--json"),
        ("abort", planted.files_sink, str(E1), "--reason", "r", "--dry-run", "--json"),
        ("commit", planted.files_sink, str(E1), "--dry-run"),
        ("commit", planted.dead_sink, str(E1), "--dry-run", "--json"),
        ("recover", "--dry-run", "--json"),
    ):
        result = eo_sink(*args, "--url", url)
        runs.append(result)
        _clean(result)
        if "--json" in args and result.stdout:
            json.loads(result.stdout)
    for bad_url in (
        f"postgresql://eo:{password}@127.0.0.1:notaport/db",  # a port that is not a number
        f"eo:{password}@127.0.0.1/db",  # no scheme at all
        f"postgresql+psycopg://eo:p@{password}@127.0.0.1/db",  # an unencoded '@', a driver not installed
    ):
        result = eo_sink("status", "--url", bad_url)
        assert result.returncode == EXIT_USAGE, result.stderr
        assert "eo:***@" in result.stderr and "--url" in result.stderr, result.stderr
        runs.append(result)
        _clean(result)
    for result in runs:
        assert password not in result.stdout + result.stderr, result.args
    shown = json.loads(runs[1].stdout)["sinks"]
    [files] = [s for s in shown if s["sink_id"] == planted.files_sink]
    assert files["root"] == "s3://AKIAEXAMPLE:***@bucket/exports"
    assert "s3://AKIAEXAMPLE:***@bucket/exports" in runs[5].stdout
    refused = json.loads(runs[7].stdout)
    assert refused["error"] == "InvalidSinkConfig" and "storage_options" in refused["message"]


@pytest.mark.parametrize("backend", ["sqlite"])
def test_an_unreachable_catalog_exits_1_with_one_line_and_valid_json(planted: Planted) -> None:
    url = planted.world.pipeline.meta_url
    for args in (
        ("commit", planted.dead_sink, str(E1), "--dry-run"),
        ("abort", planted.dead_sink, str(E1), "--reason", "down", "--dry-run"),
        ("cleanup", planted.dead_sink, str(E1)),
        ("commit", planted.dead_sink, str(E1)),
        ("gc", planted.dead_sink, "--dry-run"),
        ("gc", planted.dead_sink),
    ):
        result = eo_sink(*args, "--url", url, "--json")
        assert result.returncode == EXIT_FAILED, (args, result.stderr)
        _clean(result)
        report = json.loads(result.stdout)
        assert report["error"] == "SinkUnavailable" and report["retryable"] is True
        assert planted.dead_conn_id in report["message"]
        assert planted.dead_uri.replace(planted.password, "***") in report["message"]
        ours = [line for line in result.stderr.splitlines() if line.startswith("eo-sink ")]
        assert len(ours) == 1 and "SinkUnavailable" in ours[0], result.stderr
    row = planted.world.pipeline.store.get(planted.dead_sink, E1)
    assert row is not None and row.status.value == "Pending"


@pytest.mark.parametrize("backend", ["sqlite"])
@pytest.mark.parametrize(
    "args",
    [
        ("epochs", "--offset", str(EPOCH_MAX + 1)),
        ("epochs", "--offset", "99999999999999999999999"),
        ("show", "some-sink", str(EPOCH_MAX + 1)),
        ("gc", "--grace", "inf"),
        ("gc", "--grace", "1e400"),
        ("gc", "--grace", "999999999999w"),
        ("gc", "--grace", "nan"),
        ("gc", "--grace", "-inf"),
    ],
)
def test_numbers_past_what_a_machine_holds_are_usage_errors(world: World, args: tuple[str, ...]) -> None:
    result = eo_sink(*args, "--url", world.pipeline.meta_url)
    assert result.returncode == EXIT_USAGE, result.stderr
    _clean(result)
    assert result.stdout == ""


@pytest.mark.parametrize("backend", ["sqlite"])
def test_terminal_escapes_from_the_meta_store_are_shown_escaped(world: World) -> None:
    url, sink_id, store = world.pipeline.meta_url, world.sink_id, world.pipeline.store
    pre = write(world, E1)
    coordinator(world).persist(pre, dag_id="hourly")
    # Written by another process (a crashed task's message, a reason from before reasons were checked).
    crafted = "boom \x1b]0;owned\x07 \x1b[2J\r\x9b1m done"
    store.mark_aborted(sink_id, E1, write_id=pre.write_id, reason=crafted)
    for args in (("show", sink_id, str(E1)), ("epochs", sink_id), ("epochs",)):
        result = eo_sink(*args, "--url", url)
        assert result.returncode == EXIT_OK, result.stderr
        assert not RAW_CONTROLS.search(result.stdout + result.stderr), repr(result.stdout)
        assert "boom \\x1b]0;owned\\x07" in result.stdout
    shown = eo_sink("show", sink_id, str(E1), "--url", url, "--json")
    assert json.loads(shown.stdout)["epoch"]["error"] == crafted  # JSON keeps the text exact, escaped


@pytest.mark.parametrize("backend", ["sqlite"])
@pytest.mark.parametrize("reason", ["a\x1b]0;owned\x07", "two\nlines", "del\x7f"])
def test_an_abort_reason_with_control_characters_is_refused(world: World, reason: str) -> None:
    pre = write(world, E1)
    coordinator(world).persist(pre, dag_id="hourly")
    result = eo_sink("abort", world.sink_id, str(E1), "--reason", reason, "--url", world.pipeline.meta_url)
    assert result.returncode == EXIT_USAGE and "control character" in result.stderr, result.stderr
    _clean(result)
    assert not RAW_CONTROLS.search(result.stderr)
    row = world.pipeline.store.get(world.sink_id, E1)
    assert row is not None and row.status.value == "Pending"


def test_log_records_of_the_process_are_masked_too(tmp_path: Path) -> None:
    """Libraries log through the process's logging (Airflow replaces the handlers when imported):
    every record is masked as it is made, its traceback included."""
    out, err = io.StringIO(), io.StringIO()
    assert main(["status", "--url", f"sqlite:///{tmp_path / 'meta.db'}"], stdout=out, stderr=err) == EXIT_OK
    secret_url = "postgresql://eo:Planted-log-secret@db.example:5432/meta"
    try:
        raise ConnectionError(f"could not connect to {secret_url}")
    except ConnectionError:
        logging.getLogger("some.library").exception("retrying %s", secret_url)
    logged = err.getvalue()
    assert "retrying postgresql://eo:***@db.example:5432/meta" in logged
    assert "ConnectionError: could not connect to postgresql://eo:***@db.example" in logged
    assert "Planted-log-secret" not in logged


@pytest.mark.parametrize("backend", ["sqlite"])
def test_secrets_in_query_strings_and_quoted_passwords_are_masked_in_every_output(planted: Planted) -> None:
    url, password = planted.world.pipeline.meta_url, planted.password
    for args in (
        ("commit", planted.rest_sink, str(E1), "--dry-run"),
        ("commit", planted.rest_sink, str(E1), "--dry-run", "--json"),
        ("abort", planted.rest_sink, str(E1), "--reason", "down", "--dry-run", "--json"),
        ("gc", planted.rest_sink, "--dry-run", "--json"),
        ("recover", "--dry-run", "--json"),
    ):
        code, out, err = run_main(*args, "--url", url)
        assert code == EXIT_FAILED, (args, err)
        assert password not in out + err, args
        assert "?token=***&sig=***" in out + err, (args, out, err)
        if "--json" in args:
            json.loads(out)
    for bad_url in (
        f"postgresql://eo:ab'{password}@127.0.0.1:notaport/db",  # a quote in the password
        f"postgresql://eo:a {password}@127.0.0.1:notaport/db",  # a space in it
        f"host=127.0.0.1 password={password} dbname=meta",  # libpq's keyword form
        f"postgresql://eo@127.0.0.1:notaport/db?password={password}",
    ):
        code, out, err = run_main("status", "--url", bad_url)
        assert code == EXIT_USAGE, err
        assert password not in out + err and "***" in err, err


def test_argparse_errors_are_masked_and_escaped() -> None:
    """argparse quotes what it refuses: a URL typed where the command belongs, a crafted sink id."""
    code, out, err = run_main("--url", "postgresql://eo:Planted-PW@db.example/meta", "status")
    assert code == EXIT_USAGE and out == ""
    assert "invalid choice: 'postgresql://eo:***@db.example/meta'" in err and "Planted-PW" not in err, err
    code, _, err = run_main("status", "\x1b]0;owned\x07\x9b2J")
    assert code == EXIT_USAGE and "has characters unsafe in a path" in err
    assert not RAW_CONTROLS.search(err) and "\\x1b]0;owned" in err, repr(err)
    code, _, err = run_main("status", "--url", "sqlite://", "--nope=eo:Planted-PW@db/x")
    assert code == EXIT_USAGE and "unrecognized arguments: --nope=eo:***@db/x" in err, err


@pytest.mark.parametrize("args", [("show", "../etc", "1"), ("epochs", "../etc"), ("gc", "../etc")])
def test_a_bad_sink_id_is_a_usage_error_before_the_meta_store_is_read(args: tuple[str, ...]) -> None:
    """The service and the store below it take the sink id as given: the argument is its one check."""
    code, out, err = run_main(*args, "--url", "sqlite://")
    assert code == EXIT_USAGE and out == ""
    assert "sink_id '../etc' has characters unsafe in a path" in err, err


@pytest.mark.parametrize("backend", ["sqlite"])
def test_an_abort_reason_is_capped_where_it_enters(world: World) -> None:
    """The UI took 2000 characters at most, eo-sink and the service any length: one cap for all."""
    pre = write(world, E1)
    coordinator(world).persist(pre, dag_id="hourly")
    url = world.pipeline.meta_url
    code, _, err = run_main("abort", world.sink_id, str(E1), "--reason", "x" * 120_000, "--url", url, "--dry-run")
    assert code == EXIT_USAGE, err
    assert f"120000 characters long; at most {ABORT_REASON_MAX_LENGTH}" in err and "--reason" in err, err
    ops = SinkOperations(world.pipeline.store)
    with pytest.raises(InvalidRequest, match=f"epoch {E1}: the abort reason is 2001 characters long; at most 2000"):
        ops.abort(world.sink_id, E1, reason="x" * (ABORT_REASON_MAX_LENGTH + 1))
    done = ops.abort(world.sink_id, E1, reason="y" * ABORT_REASON_MAX_LENGTH, by="ops-team")
    assert done.outcome == "aborted"
    row = world.pipeline.store.get(world.sink_id, E1)
    assert row is not None and row.error == "y" * ABORT_REASON_MAX_LENGTH + " (by ops-team)"


def test_the_embedded_store_prints_only_the_table_on_stdout_and_no_info_on_stderr(tmp_path: Path) -> None:
    """The embedded meta store's INFO line (and Airflow's own) stayed on the terminal of every run."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW_CONN_", "AIRFLOW__LOGGING__"))}
    env["AIRFLOW_HOME"] = str(tmp_path / "airflow")
    quiet = subprocess.run([str(EO_SINK), "status"], capture_output=True, text=True, timeout=300, env=env)
    assert quiet.returncode == EXIT_OK, quiet.stderr
    assert quiet.stdout == "no sinks: nothing is registered and no epoch was persisted in this meta store\n"
    assert quiet.stderr == "", quiet.stderr
    verbose = subprocess.run(
        [str(EO_SINK), "status", "--json", "-v"], capture_output=True, text=True, timeout=300, env=env
    )
    assert verbose.returncode == EXIT_OK, verbose.stderr
    assert json.loads(verbose.stdout) == {
        "sinks": [],
        "stale_runs": [],
        "runs_not_checked": None,
        "threshold_minutes": 60.0,
    }
    assert "using the embedded meta store" in verbose.stderr


def test_an_unreadable_stored_write_is_shown_as_such_by_every_read_command(world: World) -> None:
    """Issue 54: ``eo-sink epochs`` exited 1 on one row whose consumed range does not parse. Every read
    command shows that epoch as unreadable, naming the field, and lists the rest; the script exits 0."""
    url, sink_id = world.pipeline.meta_url, world.sink_id
    coord = coordinator(world)
    good, bad = write(world, E1), write(world, E1 + 1)
    for pre in (good, bad):
        coord.persist(pre, dag_id="hourly", run_id=f"scheduled__{pre.epoch}")
    plant_stored_write(world.pipeline.store.engine, bad, source_positions=OPEN_RANGE)

    listed = eo_sink("epochs", sink_id, "--url", url)
    assert listed.returncode == EXIT_OK, listed.stderr
    assert f"sink {sink_id} epoch {E1 + 1} is unreadable: " in listed.stdout
    assert "source_positions" in listed.stdout
    assert str(E1) in listed.stdout and "unreadable (below)" in listed.stdout
    code, out, err = run_main("epochs", sink_id, "--url", url, "--json")
    assert code == EXIT_OK, err
    epochs = {e["epoch"]: e for e in json.loads(out)["epochs"]}
    assert epochs[E1]["unreadable"] is None and epochs[E1]["files"] == 1
    assert "source_positions" in epochs[E1 + 1]["unreadable"]

    code, out, err = run_main("show", sink_id, str(E1 + 1), "--url", url)
    assert code == EXIT_OK, err
    assert "unreadable" in out and "source_positions" in out and bad.write_id in out
    code, out, err = run_main("show", sink_id, str(E1 + 1), "--url", url, "--json")
    assert code == EXIT_OK, err
    assert "source_positions" in json.loads(out)["epoch"]["unreadable"]
    code, out, err = run_main("history", sink_id, str(E1 + 1), "--url", url)
    assert code == EXIT_OK and "persisted" in out, err
    code, out, err = run_main("status", "--url", url, "--json")
    assert code == EXIT_OK, err
    [ours] = [s for s in json.loads(out)["sinks"] if s["sink_id"] == sink_id]
    assert ours["counts"]["pending"] == 2


#: A pasted file, or a runaway script's variable: what an argument must never be echoed back as.
HUGE = 100_000


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("status", "--meta-conn-id", "m" * HUGE), "argument --meta-conn-id: 'mmmm"),
        (("status", "--meta-conn-id", "eo\x1b]0;x\x07"), "argument --meta-conn-id: 'eo\\x1b]0;x\\x07'"),
        (("status", "--url", "sqlite:///" + "a" * HUGE), "File name too long: 'aaaa"),
        (
            ("status", "--url", "postgresql://eo:Planted-PW@db:" + "9" * HUGE + "/meta"),
            "--url 'postgresql://eo:***@db:999",
        ),
        (("status", "--url", "x" * HUGE + "://"), "meta store xxxx"),
        (("show", "s" * HUGE, "1"), "argument sink: sink_id 'ssss"),
        (("show", "some-sink", "9" * HUGE), "argument epoch: epoch '9999"),
        (("epochs", "--status", "z" * HUGE), "argument --status: status 'zzzz"),
        (("gc", "--grace", "1" * HUGE + "h"), "argument --grace: duration '1111"),
        (("stat" + "x" * HUGE,), "invalid choice: 'statxxxx"),
        (("status", "--nope=" + "y" * HUGE), "unrecognized arguments: --nope=yyyy"),
    ],
)
def test_an_argument_is_echoed_as_a_bounded_prefix_however_long(args: tuple[str, ...], named: str) -> None:
    """``--meta-conn-id`` of 100,000 characters put all of them on stderr; so did ``--url`` and
    argparse's own echoes. The message names the argument and shows its start and its length."""
    result = subprocess.run([str(EO_SINK), *args], capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert result.returncode in (EXIT_USAGE, EXIT_FAILED), result.stderr[-2000:]
    assert named in result.stderr, result.stderr[-2000:]
    assert len(result.stderr) < 1500, f"{len(result.stderr)} characters on stderr: {result.stderr[-500:]}"
    assert "Planted-PW" not in result.stderr and not RAW_CONTROLS.search(result.stderr)


@pytest.mark.parametrize("backend", ["sqlite"])
def test_an_action_prints_nothing_of_airflows_secrets_masker(world: World) -> None:
    """Rebuilding the sink's committer reads its Iceberg connection, whose ``"type": "sql"`` made
    Airflow's masker print "Skipping masking for a secret as it's too short" on every action."""
    url, sink_id = world.pipeline.meta_url, world.sink_id
    coordinator(world).persist(write(world, E1), dag_id="hourly")
    for args in (("recover", sink_id), ("gc", sink_id, "--dry-run"), ("recover", sink_id, "-v")):
        result = eo_sink(*args, "--url", url)
        assert result.returncode == EXIT_OK, result.stderr
        assert "Skipping masking" not in result.stderr and "too short" not in result.stderr, result.stderr
    assert "orphaned past the" in result.stderr  # -v: the INFO lines of the action itself are still shown
