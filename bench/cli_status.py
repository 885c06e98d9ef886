"""How long ``eo-sink`` takes to answer, for an operator at a terminal: ``status`` and ``epochs``.

Each command is a fresh interpreter, as a shell runs it: ``eo-sink <command> --url sqlite:///...`` on a SQLite meta store that is empty, and on one holding 3 sinks of
200 epochs each. Beside them, in the same rounds: the interpreter alone (``python -c pass``), and
the import of the CLI's module, so that what the command costs beyond starting Python is read as a
difference measured under the same load. The target (issue 36): ``status`` within 1 s on a quiet
machine.

Without ``--url`` (the last case), ``eo-sink`` resolves the default meta-store connection through
Airflow, as an operator on an Airflow machine runs it (no connection defined here: the embedded
SQLite under ``AIRFLOW_HOME``, one per tree).

``--tree`` names source trees (checkouts of this repository) measured in alternation, as
``bench.task_start`` does, so a "before" and an "after" share the machine's drift. Each tree's
sources and the environment are compiled to bytecode first (``bench._bytecode``), as an installed
deployment's are. Medians of ``--rounds``.

    uv run python -m bench.cli_status [--rounds 9] [--tree before=/tmp/before --tree after=.]

Writes bench/results/cli_status.json and .png.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from bench._bytecode import compile_bytecode
from bench._world import RESULTS, median, save

ROOT = Path(__file__).resolve().parents[1]
CLI = "airflow_provider_exactly_once.cli.main"
#: ``eo-sink`` as its console script runs it (the module has no ``__main__``), arguments from the command line.
RUN = f"import sys; from {CLI} import main; sys.exit(main())"
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


def _timed(argv: list[str], tree: Path, env: dict[str, str]) -> float:
    started = time.perf_counter()
    env = {**env, "PYTHONPATH": str(tree), "AIRFLOW_HOME": f"{env['AIRFLOW_HOME']}/{tree.name}"}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tree)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{argv} in {tree} failed ({done.returncode}): {done.stderr[-2000:]}")
    return seconds


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
            stores[name] = {"empty": empty, "full": full}
        cases = {
            "python -c pass": lambda name: ["-c", "pass"],
            "import the CLI": lambda name: ["-c", f"import {CLI}"],
            "status, empty store": lambda name: ["-c", RUN, "status", "--url", stores[name]["empty"]],
            f"status, {SINKS}x{EPOCHS} epochs": lambda name: ["-c", RUN, "status", "--url", stores[name]["full"]],
            "epochs --limit 50": lambda name: ["-c", RUN, "epochs", "--limit", "50", "--url", stores[name]["full"]],
            # no --url: the default connection, resolved through Airflow (none defined: the embedded SQLite)
            "status, default connection": lambda name: ["-c", RUN, "status"],
        }
        samples: dict[str, dict[str, list[float]]] = {name: {case: [] for case in cases} for name in trees}
        for _ in range(args.rounds):
            for case, command in cases.items():
                for name, tree in trees.items():
                    samples[name][case].append(_timed([_python(tree), *command(name)], tree, env))
    results: dict[str, Any] = {
        name: {
            case: {"median_s": round(median(values), 3), "samples_s": [round(v, 3) for v in values]}
            for case, values in per_case.items()
        }
        for name, per_case in samples.items()
    }
    for per_case in results.values():
        base = per_case["python -c pass"]["median_s"]
        for case in per_case.values():
            case["beyond_python_s"] = round(case["median_s"] - base, 3)
    path = save(
        "cli_status", {"rounds": args.rounds, "trees": {k: str(v) for k, v in trees.items()}, "results": results}
    )
    _plot(results)
    for name, per_case in results.items():
        print(name, {case: value["median_s"] for case, value in per_case.items()})
    print(path)
    return 0


def _plot(results: dict[str, Any]) -> None:
    cases = list(next(iter(results.values())))
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / len(results)
    for n, (name, per_case) in enumerate(results.items()):
        xs = [i + n * width for i in range(len(cases))]
        ax.bar(xs, [per_case[c]["median_s"] for c in cases], width, label=name)
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1, label="target for status (1 s)")
    ax.set_xticks([i + width * (len(results) - 1) / 2 for i in range(len(cases))], cases, rotation=15, fontsize=8)
    ax.set_ylabel("seconds (median, fresh interpreter)")
    ax.set_title("eo-sink: time to answer")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / "cli_status.png", dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
