"""How long ``eo-sink`` takes to answer, for an operator at a terminal: ``status`` and ``epochs``.

Each command is a fresh interpreter, as a shell runs it. With a URL given (``--url sqlite:///...``,
or ``EO_SINK_URL``), nothing of Airflow is imported: ``status`` on a SQLite meta store that is
empty and on one holding 3 sinks of 200 epochs each, ``epochs --limit 50``. Beside them, in the
same rounds: the interpreter alone (``python -c pass``), and the import of the CLI's module, so that
what the command costs beyond starting Python is read as a difference measured under the same load.
The target (issues 36 and 56): ``status`` with a URL within 1 s on a quiet machine.

Without a URL, ``eo-sink`` asks Airflow for the meta-store connection as Airflow's server processes
do (docs/design.md, D20), which takes what importing Airflow takes: the default connection when
none is defined anywhere (the embedded SQLite under ``AIRFLOW_HOME``, one per tree); a connection
kept in Airflow's database, as the UI makes it (a home migrated by ``airflow db migrate``); one in
``AIRFLOW_CONN_*`` as JSON and as a URI; one in a secrets backend (Airflow's
``LocalFilesystemBackend``, a connections file).

``--tree`` names source trees (checkouts of this repository) measured in alternation, as
``bench.task_start`` does, so a "before" and an "after" share the machine's drift. Each tree's
sources and the environment are compiled to bytecode first (``bench._bytecode``), as an installed
deployment's are. Medians of ``--rounds``; the machine's load average (1 min) before and after.

    uv run python -m bench.cli_status [--rounds 9] [--tree before=/tmp/before --tree after=.]

Writes bench/results/cli_status.json and .png.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from bench._bytecode import compile_bytecode
from bench._world import RESULTS, median, save, tree_named

ROOT = Path(__file__).resolve().parents[1]
CLI = "airflow_provider_exactly_once.cli.main"
#: ``eo-sink`` as its console script runs it (the module has no ``__main__``), arguments from the command line.
RUN = f"import sys; from {CLI} import main; sys.exit(main())"
#: The environment variable of the default connection.
CONN_ENV = "AIRFLOW_CONN_EXACTLY_ONCE_DEFAULT"
#: Sinks and epochs of the populated store.
SINKS, EPOCHS = 3, 200

#: Fills a meta store (argv[1]: its URL) with Pending epochs, through the tree's own store.
FILL = f"""
import sys
from airflow_provider_exactly_once.core.precommit import PreCommit, TableWrite
from airflow_provider_exactly_once.store import SqlSinkStateStore
store = SqlSinkStateStore(sys.argv[1])
for s in range({SINKS}):
    for e in range(1, {EPOCHS} + 1):
        pre = PreCommit(sink_id=f"bench-{{s}}", epoch=e * 3_600_000, write_id=f"00000000-0000-4000-8000-{{s:04d}}{{e:08d}}",
                        tables=[TableWrite(table="ns.t", location=f"file:///tmp/bench/{{s}}/{{e}}")])
        store.insert_pending(pre, run_id=f"scheduled__{{e}}", try_number=1, dag_id="bench")
store.dispose()
"""


def _python(tree: Path) -> str:
    python = tree / ".venv" / "bin" / "python"
    return str(python if python.exists() else Path(sys.executable))


#: Adds the meta-store connection to the Airflow database of ``AIRFLOW_HOME`` (argv[1]: its URL), as the UI does.
ADD_CONNECTION = """
import sys
from airflow.models.connection import Connection
from airflow.utils.session import create_session
with create_session() as session:
    session.add(Connection(conn_id="exactly_once_default", conn_type="exactly_once_meta", host=sys.argv[1]))
"""
#: The URI form of that connection, which Airflow parses (argv[1]: its URL).
URI_OF = """
import sys
from airflow.models.connection import Connection
print(Connection(conn_id="x", conn_type="exactly_once_meta", host=sys.argv[1]).get_uri())
"""


@dataclass(frozen=True)
class Case:
    """A command: its arguments, its environment beyond the tree's, its Airflow home's suffix (the
    migrated home: ``-airflow``), and what it must print (the store it was to read)."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    home: str = ""
    expect: str = ""


def _timed(argv: list[str], tree: Path, env: dict[str, str], home: str = "", expect: str = "") -> float:
    """Seconds to run ``argv``; ``expect``: what its output must hold (the store it was to read)."""
    started = time.perf_counter()
    env = {**env, "PYTHONPATH": str(tree), "AIRFLOW_HOME": f"{env['AIRFLOW_HOME']}/{tree.name}{home}"}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tree)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{argv} in {tree} failed ({done.returncode}): {done.stderr[-2000:]}")
    if expect not in done.stdout:
        raise WrongStore(seconds, done.stdout[-300:])
    return seconds


class WrongStore(Exception):
    """The command answered from another meta store than the case's (a tree that cannot find the
    connection): its time is kept, marked, since it did not do the case's work."""

    def __init__(self, seconds: float, output: str) -> None:
        super().__init__(output)
        self.seconds = seconds


def _airflow_home(tree: Path, env: dict[str, str], url: str) -> str:
    """A home beside the tree's, migrated by Airflow, its connection in the database; the connection's URI."""
    home = f"{env['AIRFLOW_HOME']}/{tree.name}-airflow"
    os.makedirs(home, exist_ok=True)
    airflow = str(Path(_python(tree)).parent / "airflow")
    _timed([airflow, "db", "migrate"], tree, env, "-airflow")
    _timed([_python(tree), "-c", ADD_CONNECTION, url], tree, env, "-airflow")
    done = subprocess.run(
        [_python(tree), "-c", URI_OF, url],
        capture_output=True,
        text=True,
        env={**env, "AIRFLOW_HOME": home},
        check=True,
    )
    return done.stdout.strip().splitlines()[-1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cli_status", description=__doc__)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--tree", action="append", default=[], help="NAME=PATH of a source tree (repeatable)")
    args = parser.parse_args(argv)
    trees = {name: Path(path).resolve() for name, path in (t.split("=", 1) for t in args.tree)} or {"this tree": ROOT}
    for tree in trees.values():
        compile_bytecode(tree / "airflow_provider_exactly_once")
    with tempfile.TemporaryDirectory(prefix="eo-cli-status-") as home:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "EO_"))}
        env["AIRFLOW_HOME"] = home
        stores: dict[str, dict[str, str]] = {}
        for n, (name, tree) in enumerate(trees.items()):  # a store per tree: each migrates its own
            empty, full = f"sqlite:///{home}/empty-{n}.db", f"sqlite:///{home}/full-{n}.db"
            _timed([_python(tree), "-c", RUN, "status", "--url", empty], tree, env)
            _timed([_python(tree), "-c", FILL, full], tree, env)
            connections = Path(home) / f"connections-{n}.json"
            connections.write_text(
                json.dumps({"exactly_once_default": {"conn_type": "exactly_once_meta", "host": full}})
            )
            stores[name] = {
                "empty": empty,
                "full": full,
                "uri": _airflow_home(tree, env, full),
                "file": str(connections),
            }
        status = ["-c", RUN, "status"]
        cases: dict[str, Callable[[str], Case]] = {
            "python -c pass": lambda name: Case(["-c", "pass"]),
            "import the CLI": lambda name: Case(["-c", f"import {CLI}"]),
            "status --url, empty store": lambda name: Case([*status, "--url", stores[name]["empty"]]),
            f"status --url, {SINKS}x{EPOCHS} epochs": lambda name: Case([*status, "--url", stores[name]["full"]]),
            "status, EO_SINK_URL": lambda name: Case(status, {"EO_SINK_URL": stores[name]["full"]}, expect="bench-0"),
            "epochs --limit 50 --url": lambda name: Case(
                ["-c", RUN, "epochs", "--limit", "50", "--url", stores[name]["full"]]
            ),
            # no URL: Airflow is asked, as its server processes ask it
            "status, no connection (embedded store)": lambda name: Case(status),
            "status, connection in Airflow's database": lambda name: Case(status, home="-airflow", expect="bench-0"),
            "status, JSON connection in AIRFLOW_CONN_*": lambda name: Case(
                status,
                {CONN_ENV: json.dumps({"conn_type": "exactly_once_meta", "host": stores[name]["full"]})},
                expect="bench-0",
            ),
            "status, URI connection in AIRFLOW_CONN_*": lambda name: Case(
                status, {CONN_ENV: stores[name]["uri"]}, expect="bench-0"
            ),
            "status, connection in a secrets backend": lambda name: Case(
                status,
                {
                    "AIRFLOW__SECRETS__BACKEND": "airflow.secrets.local_filesystem.LocalFilesystemBackend",
                    "AIRFLOW__SECRETS__BACKEND_KWARGS": json.dumps({"connections_file_path": stores[name]["file"]}),
                },
                expect="bench-0",
            ),
        }
        samples: dict[str, dict[str, list[float]]] = {name: {case: [] for case in cases} for name in trees}
        wrong_store: dict[str, dict[str, str]] = {name: {} for name in trees}
        load_before = os.getloadavg()[0]
        for _ in range(args.rounds):
            for label, case_of in cases.items():
                for name, tree in trees.items():
                    case = case_of(name)
                    try:
                        seconds = _timed([_python(tree), *case.argv], tree, {**env, **case.env}, case.home, case.expect)
                    except WrongStore as wrong:
                        seconds, wrong_store[name][label] = wrong.seconds, str(wrong)
                    samples[name][label].append(seconds)
        load_after = os.getloadavg()[0]
    results: dict[str, Any] = {
        name: {
            case: {"median_s": round(median(values), 3), "samples_s": [round(v, 3) for v in values]}
            for case, values in per_case.items()
        }
        for name, per_case in samples.items()
    }
    for name, per_case in results.items():
        base = per_case["python -c pass"]["median_s"]
        for case_name, case in per_case.items():
            case["beyond_python_s"] = round(case["median_s"] - base, 3)
            if case_name in wrong_store[name]:
                case["wrong_store"] = wrong_store[name][case_name]
    trees_named = {k: tree_named(v) for k, v in trees.items()}
    load = {"before": load_before, "after": load_after}
    path = save("cli_status", {"rounds": args.rounds, "trees": trees_named, "load_1min": load, "results": results})
    _plot(results)
    for name, per_case in results.items():
        print(name, {case: value["median_s"] for case, value in per_case.items()})
    print("load average (1 min) before and after:", load)
    print(path)
    return 0


def _plot(results: dict[str, Any]) -> None:
    cases = list(next(iter(results.values())))
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / len(results)
    for n, (name, per_case) in enumerate(results.items()):
        xs = [i + n * width for i in range(len(cases))]
        bars = ax.bar(xs, [per_case[c]["median_s"] for c in cases], width, label=name)
        for bar, case in zip(bars, cases, strict=True):
            if "wrong_store" in per_case[case]:  # answered from another store: not the case's work
                bar.set_hatch("//")
                ax.annotate(
                    "wrong store", (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", fontsize=7
                )
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1, label="target for status (1 s)")
    ax.set_xticks([i + width * (len(results) - 1) / 2 for i in range(len(cases))], cases, rotation=15, fontsize=8)
    ax.set_ylabel("seconds (median, fresh interpreter)")
    ax.set_title("eo-sink: time to answer")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / "cli_status.png", dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
