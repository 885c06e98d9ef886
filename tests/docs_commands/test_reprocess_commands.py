"""docs/first-pipeline.md's commands that pick a day, run as written against real Airflow runs.

The tutorial's ``orders`` DAG (``orders_dag.py``: its timetable, checkpoint and task group, a plain
Python write in place of Spark) runs two days in an ``AIRFLOW_HOME`` of the test's own, with the
real ``airflow`` and ``eo-sink`` commands in subprocesses. The commands of section 7 are taken from
the page's code blocks, so a change to the page is a change to what is run. Each command must
select the run of the day the tutorial means, 2024-06-01 (the interval [2024-06-01, 2024-06-02)),
and never the day before, which a date taken for the day's start selects after ``dags test`` runs.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "first-pipeline.md"
DEPLOYMENT = REPO / "docs" / "deployment.md"
BIN = Path(sys.executable).parent
DAY_1 = 1_717_113_600_000  # [2024-05-31, 2024-06-01)
DAY_2 = 1_717_200_000_000  # [2024-06-01, 2024-06-02): the day the tutorial reprocesses
DAY_2_INTERVAL = "[2024-06-01T00:00Z, 2024-06-02T00:00Z)"
ORDERS = {
    "2024/05/31": ['{"order_id": "a1"}', '{"order_id": "a2"}'],
    "2024/06/01": ['{"order_id": "b1"}'],
}


def section(number: int) -> str:
    text = DOC.read_text(encoding="utf-8")
    start = text.index(f"\n## {number}. ")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else len(text)]


def bash_lines(text: str) -> list[str]:
    """Every command of the text's ``bash`` blocks, continuation lines joined, comments dropped."""
    commands = []
    for block in re.findall(r"^```bash\n(.*?)^```", text, re.MULTILINE | re.DOTALL):
        for command in block.replace("\\\n", " ").splitlines():
            command = re.sub(r"\s+#.*$", "", command).strip()
            if command and not command.startswith("#"):
                commands.append(command)
    return commands


def documented(text: str, prefix: str) -> str:
    """The one command of ``text`` that starts with ``prefix``: the page must still give it."""
    found = [c for c in bash_lines(text) if c.startswith(prefix)]
    assert len(found) == 1, f"first-pipeline.md gives {len(found)} commands starting {prefix!r}: {found}"
    return found[0]


@dataclass
class Tutorial:
    home: Path
    env: dict[str, str]

    def run(self, command: str, *, stdin: str | None = None, timeout: float = 300) -> str:
        """A documented command, by bash, in the tutorial's environment; its output (it must succeed)."""
        done = subprocess.run(
            ["bash", "-c", command],
            env=self.env,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.home,
        )
        assert done.returncode == 0, f"{command}\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
        return done.stdout

    def land(self, day: str, lines: list[str]) -> None:
        folder = self.home / "landing" / day
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "part-0.json").write_text("\n".join(lines) + "\n")
        (folder / "_SUCCESS").touch()

    def runs(self) -> dict[str, dict[str, Any]]:
        """Airflow's runs of ``orders``, read from its metadata DB (this process keeps its own Airflow);
        dates as text, as SQLite stores them."""
        url = self.env.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", f"sqlite:///{self.home / 'airflow.db'}")
        engine = sa.create_engine(url)
        try:
            with engine.connect() as db:
                rows = db.execute(
                    sa.text(
                        "SELECT run_id, logical_date, data_interval_start, clear_number, state, backfill_id"
                        " FROM dag_run WHERE dag_id = 'orders'"
                    )
                ).mappings()
                found = [dict(row) for row in rows]
        finally:
            engine.dispose()
        for row in found:
            for column in ("logical_date", "data_interval_start"):
                if row[column] is not None:
                    row[column] = str(row[column])
        return {row["run_id"]: row for row in found}

    def epochs(self) -> dict[int, dict[str, Any]]:
        listed = json.loads(self.run("eo-sink epochs orders --json"))["epochs"]
        return {e["epoch"]: e for e in listed}

    def table_rows(self) -> dict[int, int]:
        """Rows per epoch in the table's current snapshot."""
        from pyiceberg.catalog.sql import SqlCatalog

        catalog = SqlCatalog(
            "iceberg_default", uri=f"sqlite:///{self.home / 'catalog.db'}", warehouse=f"file://{self.home}/warehouse"
        )
        counts: dict[int, int] = {}
        for row in catalog.load_table("shop.orders").scan(selected_fields=("epoch",)).to_arrow().to_pylist():
            counts[row["epoch"]] = counts.get(row["epoch"], 0) + 1
        return counts


def _tutorial(tmp: Path, **extra_env: str) -> Tutorial:
    home = tmp / "eo-tutorial"
    (home / "dags").mkdir(parents=True)
    (home / "warehouse").mkdir()
    shutil.copy(Path(__file__).with_name("orders_dag.py"), home / "dags" / "orders.py")
    recovery = re.findall(r"^```python\n(.*?)^```", DEPLOYMENT.read_text(encoding="utf-8"), re.MULTILINE | re.DOTALL)
    [recovery_file] = [b for b in recovery if "recovery_dag()" in b]
    (home / "dags" / "exactly_once_recovery.py").write_text(recovery_file)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "EXACTLY_ONCE", "EO_"))}
    env.update(
        {
            "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}",
            "PYTHONPATH": str(REPO),  # the DAG's write task uses the tests' Parquet writer
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
            "AIRFLOW_CONN_ICEBERG_DEFAULT": json.dumps(
                {
                    "conn_type": "iceberg",
                    "extra": {
                        "type": "sql",
                        "uri": f"sqlite:///{home}/catalog.db",
                        "warehouse": f"file://{home}/warehouse",
                    },
                }
            ),
            **extra_env,
        }
    )
    tutorial = Tutorial(home, env)
    # The metadata DB from the ORM (what ``airflow db migrate`` ends with, in a fraction of the time).
    tutorial.run(
        f"{sys.executable} -c 'from airflow.utils import db; db.initdb()"
        "; from airflow.dag_processing.bundles.manager import DagBundlesManager"
        "; DagBundlesManager().sync_bundles_to_db()'"
    )
    from tests.support.pipeline import Pipeline

    pipeline = Pipeline(
        meta_url=f"sqlite:///{tmp / 'unused-meta.db'}",
        catalog_url=f"sqlite:///{home / 'catalog.db'}",
        warehouse=home / "warehouse",
        catalog_name="iceberg_default",
        namespace="shop",
    )
    pipeline.create_table("orders")
    pipeline.dispose()
    for day, lines in ORDERS.items():
        tutorial.land(day, lines)
    return tutorial


@pytest.fixture
def tutorial(tmp_path: Path) -> Iterator[Tutorial]:
    yield _tutorial(tmp_path)


def test_after_dags_test_runs_the_documented_commands_select_the_day_meant(tutorial: Tutorial) -> None:
    listed = tutorial.run(documented(section(3), "airflow dags list --local"))
    assert re.search(r"^orders\s", listed, re.MULTILINE) and re.search(r"^exactly_once_recovery\s", listed, re.M)

    tutorial.run("airflow dags test orders 2024-06-01")  # section 4: the day 2024-05-31
    tutorial.run("airflow dags test orders 2024-06-02")  # the day 2024-06-01
    runs = tutorial.runs()
    assert sorted((r["logical_date"][:10], r["data_interval_start"][:10]) for r in runs.values()) == [
        ("2024-06-01", "2024-05-31"),
        ("2024-06-02", "2024-06-01"),
    ]
    [day_2_run] = [run_id for run_id, r in runs.items() if r["data_interval_start"].startswith("2024-06-01")]

    seven = section(7)
    correction = [c for c in bash_lines(seven) if c.startswith("printf") and "2024/06/01/part-0.json" in c]
    assert len(correction) == 1, "section 7 no longer corrects 2024-06-01"
    tutorial.run(correction[0])

    # What the user reads: the day's interval, its run and that run's logical date, in one row.
    table = tutorial.run(documented(seven, "eo-sink epochs orders"))
    [row] = [line for line in table.splitlines() if DAY_2_INTERVAL in line]
    assert day_2_run in row and row.split()[-1] == "2024-06-02T00:00Z", table
    shown = tutorial.epochs()[DAY_2]
    assert (shown["run_id"], shown["logical_date"]) == (day_2_run, "2024-06-02T00:00:00+00:00")
    assert (shown["interval_start"], shown["interval_end"]) == (
        "2024-06-01T00:00:00+00:00",
        "2024-06-02T00:00:00+00:00",
    )
    listed_runs = tutorial.run(documented(seven, "airflow dags list-runs orders"))
    [listed] = [line for line in listed_runs.splitlines() if day_2_run in line]
    assert "2024-06-02T00:00:00+00:00" in listed

    # The clear the page gives lists the day's run before it asks, and clears that run alone.
    clear = documented(seven, "airflow tasks clear orders")
    asked = tutorial.run(clear, stdin="y\n")
    assert day_2_run in asked and not any(r in asked for r in runs if r != day_2_run), asked
    cleared = {run_id: r for run_id, r in tutorial.runs().items() if r["clear_number"] == 1}
    assert list(cleared) == [day_2_run] and cleared[day_2_run]["data_interval_start"].startswith("2024-06-01")

    # A backfill by the day's start would take over the day before's run, as the page warns: its
    # dry run runs the logical date 2024-06-01, which is the ``dags test`` run of 2024-05-31.
    assert "`--from-date 2024-06-01` would take over the `dags test` run of 2024-05-31" in " ".join(seven.split())
    dry = tutorial.run(
        "airflow backfill create --dag-id orders --from-date 2024-06-01 --to-date 2024-06-01"
        " --reprocess-behavior completed --dry-run"
    )
    assert "2024-06-01 00:00:00+00:00" in dry
    [taken_over] = [r for r in tutorial.runs().values() if r["logical_date"].startswith("2024-06-01")]
    assert taken_over["data_interval_start"].startswith("2024-05-31")

    # The rerun the page gives here and now: the day's rows are replaced, the other day's kept.
    before = tutorial.table_rows()
    assert before == {DAY_1: 2, DAY_2: 1}
    tutorial.run(documented(seven, "airflow dags test orders"))
    assert tutorial.table_rows() == {DAY_1: 2, DAY_2: 2}
    epochs = tutorial.epochs()
    assert (epochs[DAY_1]["revision"], epochs[DAY_2]["revision"]) == (0, 1)
    revisions = tutorial.run(documented(seven, "eo-sink show orders"))
    assert re.search(r"^0\s+Replaced\s.*" + re.escape(day_2_run), revisions, re.MULTILINE), revisions
    assert day_2_run not in tutorial.runs(), "the rerun deletes the earlier run, as section 5 says"


@pytest.mark.slow
@pytest.mark.postgres
def test_with_the_scheduler_the_documented_clear_and_backfill_select_the_day_meant(
    tmp_path: Path, pg_database_url: str
) -> None:
    """The days run by the scheduler (catch-up over two days), then the clear and the backfill the
    page gives for scheduled runs (the day's start is their logical date) rerun the day 2024-06-01,
    which the scheduler commits as revisions of that epoch alone."""
    # Airflow's metadata DB on PostgreSQL, as section 3 advises beyond a try: on SQLite, written at
    # once by the scheduler, the dag-processor, the api-server, the tasks and the CLI,
    # `airflow backfill create` met "database is locked" in CI even with a 60 s busy wait (a read
    # transaction that upgrades to a write while another writer waits fails at once).
    tutorial = _tutorial(
        tmp_path,
        EO_DOC_CATCHUP="1",
        AIRFLOW__CORE__EXECUTOR="LocalExecutor",
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=pg_database_url,
    )
    with _services(tutorial):
        # The page's prerequisite: the DAG is created paused, and can be unpaused once a dag-processor
        # stored it (before that, ``airflow dags unpause`` finds nothing to unpause).
        _wait(lambda: "orders" in tutorial.run("airflow dags list -o plain").split())
        tutorial.run("airflow dags unpause orders")
        _wait(
            lambda: (
                {e: v["status"] for e, v in _epochs_or_none(tutorial).items()}
                == dict.fromkeys((DAY_1, DAY_2), "Committed")
            )
        )
        runs = tutorial.runs()
        [day_2_run] = [run_id for run_id, r in runs.items() if r["data_interval_start"].startswith("2024-06-01")]
        shown = tutorial.epochs()[DAY_2]
        assert (shown["run_id"], shown["logical_date"]) == (day_2_run, "2024-06-01T00:00:00+00:00")

        tutorial.land("2024/06/01", ['{"order_id": "b1"}', '{"order_id": "b2"}'])
        asked = tutorial.run("airflow tasks clear orders -s 2024-06-01 -e 2024-06-01", stdin="y\n")
        assert day_2_run in asked and not any(r in asked for r in runs if r != day_2_run), asked
        _wait(lambda: _epochs_or_none(tutorial).get(DAY_2, {}).get("revision") == 1 and _committed(tutorial))
        assert tutorial.table_rows() == {DAY_1: 2, DAY_2: 2}

        tutorial.land("2024/06/01", ['{"order_id": "b1"}', '{"order_id": "b2"}', '{"order_id": "b3"}'])
        tutorial.run(
            "airflow backfill create --dag-id orders --from-date 2024-06-01 --to-date 2024-06-01"
            " --reprocess-behavior completed"
        )
        backfilled = [r for r in tutorial.runs().values() if r["backfill_id"] is not None]
        assert [r["data_interval_start"][:10] for r in backfilled] == ["2024-06-01"]
        _wait(lambda: _epochs_or_none(tutorial).get(DAY_2, {}).get("revision") == 2 and _committed(tutorial))
        assert tutorial.table_rows() == {DAY_1: 2, DAY_2: 3}
        assert _epochs_or_none(tutorial)[DAY_1]["revision"] == 0


def _epochs_or_none(tutorial: Tutorial) -> dict[int, dict[str, Any]]:
    try:
        return tutorial.epochs()
    except AssertionError:  # the meta store does not exist before the first persist
        return {}


def _committed(tutorial: Tutorial) -> bool:
    return all(e["status"] == "Committed" for e in _epochs_or_none(tutorial).values())


def _wait(done: Any, timeout: float = 420) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if done():
            return
        time.sleep(3)
    raise AssertionError(f"not done after {timeout} s")


class _services:
    """``airflow api-server``, ``scheduler`` and ``dag-processor``, as section 3 lists them."""

    def __init__(self, tutorial: Tutorial) -> None:
        self.tutorial = tutorial
        self.processes: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> _services:
        from tests.support.builders import free_port

        port = free_port()
        # Section 3: services started one by one share one secret for the tasks' tokens.
        assert "export AIRFLOW__API_AUTH__JWT_SECRET=" in " ".join(DOC.read_text(encoding="utf-8").split())
        env = {
            **self.tutorial.env,
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(16),
            "AIRFLOW__API__PORT": str(port),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
            # The scheduler's log server: Airflow's fixed 8793 would meet another test's scheduler.
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
        }
        self.tutorial.env = env
        for command in (["api-server", "--port", str(port), "--workers", "1"], ["scheduler"], ["dag-processor"]):
            log = (self.tutorial.home / f"{command[0]}.log").open("wb")
            self.processes.append(
                subprocess.Popen(
                    [str(BIN / "airflow"), *command],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        return self

    def __exit__(self, *exc: object) -> None:
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, 15)
        for process in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, 9)
                process.wait()
