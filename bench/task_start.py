"""What the provider adds to every task start of an epoch, phase by phase, for two source trees side by side.

An Airflow 3 task start is a fresh interpreter: the task runner imports the SDK, parses the task's
DAG file, then runs ``execute``. For the epoch's persist and commit tasks, ``execute`` opens the
meta store, registers the sink, builds the coordinator (which loads the sink's Iceberg catalog
through its connection) and takes its step. Each round here is one persist and one commit, each in
a fresh interpreter that does exactly that with the real connection classes (``AIRFLOW_CONN_*``
connections to a SQLite meta store and a SQLite catalog) and times every phase:

- ``airflow_sdk``: ``import airflow.sdk`` (Airflow's own; the reference);
- ``dag_parse``: running the example DAG file (``dags/hourly_events.py``), as the task runner does;
- ``open_store``: ``ExactlyOnceMetaStoreHook.get_store()`` (imports, engine, the schema check);
- ``coordinator``: the sink registered and ``coordinator_for`` (the catalog loaded);
- ``step``: ``persist`` or ``commit`` of a one-file epoch.

``--tree`` names source trees (checkouts of this repository, each with its own ``.venv``, or sharing
this one) measured in alternation, so that "before" and "after" are compared in the same run on the
same machine. Medians of ``--rounds``. Each tree's environment and sources are compiled to bytecode
first (``bench._bytecode``), as an installed deployment's are.

    uv run python -m bench.task_start [--rounds 7] [--tree before=/tmp/before --tree after=.]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from airflow_provider_exactly_once.core.precommit import PreCommit, TableWrite
from bench._bytecode import compile_bytecode
from bench._world import RESULTS, save, world, write_files

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("airflow_sdk", "dag_parse", "open_store", "coordinator", "step")
SINK_ID = "bench-task-start"

#: One task start, in a fresh interpreter: argv[1] is a JSON settings file; prints JSON phase times.
CHILD = """
import json, runpy, sys, time
settings = json.loads(open(sys.argv[1]).read())
times = {}
t = time.perf_counter()
import airflow.sdk  # noqa: F401
times["airflow_sdk"] = time.perf_counter() - t
t = time.perf_counter()
runpy.run_path(settings["dag"])
times["dag_parse"] = time.perf_counter() - t
t = time.perf_counter()
from airflow_provider_exactly_once.hooks.meta_store import ExactlyOnceMetaStoreHook
store = ExactlyOnceMetaStoreHook(settings["meta_conn_id"]).get_store()
times["open_store"] = time.perf_counter() - t
if settings["step"] == "commit":  # untimed: the checkpoint the commit waits for, in this tree's store
    from airflow_provider_exactly_once.core.epochs import CheckpointStatus
    store.checkpoints.set_checkpoint(settings["sink"]["sink_id"], settings["epoch"], CheckpointStatus.COMPLETED)
t = time.perf_counter()
from airflow_provider_exactly_once.runtime.assembly import as_sink, coordinator_for
sink = as_sink(settings["sink"])
store.registry.register_sink(sink.sink_id, sink.model_dump(mode="json"), None)
coordinator = coordinator_for(sink, None, store=store, epoch=settings["epoch"])
times["coordinator"] = time.perf_counter() - t
t = time.perf_counter()
if settings["step"] == "persist":
    from airflow_provider_exactly_once.core.precommit import PreCommit
    coordinator.persist(PreCommit.from_json(open(settings["pre_commit"], "rb").read()))
else:
    outcome = coordinator.commit(sink.sink_id, settings["epoch"])
    assert outcome.outcome.value == "committed", outcome
times["step"] = time.perf_counter() - t
store.dispose()
print(json.dumps(times))
"""


def _start(tree: Path, settings: Path, env: dict[str, str]) -> dict[str, float]:
    python = tree / ".venv" / "bin" / "python"
    if not python.exists():
        python = Path(sys.executable)
    done = subprocess.run(
        [str(python), "-c", CHILD, str(settings)],
        capture_output=True,
        text=True,
        env={**env, "PYTHONPATH": str(tree)},
        cwd=tree,
        timeout=600,
    )
    if done.returncode != 0:
        raise RuntimeError(f"a task start in {tree} failed: {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.task_start", description=__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--tree", action="append", default=[], help="NAME=PATH of a source tree (repeatable)")
    parser.add_argument("--name", default="task_start", help="result file name (without extension)")
    args = parser.parse_args(argv)
    trees = dict(t.split("=", 1) for t in args.tree) or {"this tree": str(ROOT)}
    trees_p = {name: Path(path).resolve() for name, path in trees.items()}
    for tree in trees_p.values():
        python = tree / ".venv" / "bin" / "python"
        if python.exists():  # its own environment: compiled by its own interpreter
            subprocess.run([str(python), "-m", "compileall", "-q", "-j", "0", str(tree / ".venv" / "lib")], check=False)
        compile_bytecode(tree / "airflow_provider_exactly_once", tree / "dags")
    results: dict[str, dict[str, dict[str, list[float]]]] = {
        name: {step: {phase: [] for phase in PHASES} for step in ("persist", "commit")} for name in trees_p
    }
    with world("sqlite") as w, tempfile.TemporaryDirectory(prefix="eo-task-start-") as home:
        table = w.table("task_start")
        catalog_uri = str(w.catalog.engine.url)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "EO_"))}
        env.update(
            {
                "AIRFLOW_HOME": home,
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "AIRFLOW_CONN_BENCH": json.dumps(
                    {
                        "conn_type": "iceberg",
                        "extra": {"type": "sql", "uri": catalog_uri, "warehouse": f"file://{w.root / 'warehouse'}"},
                    }
                ),
            }
        )
        # A meta store per tree: each migrates its own on first use, and an older package refuses
        # a database a newer one migrated.
        for n in range(len(trees_p)):
            env[f"AIRFLOW_CONN_BENCH_META_{n}"] = json.dumps(
                {"conn_type": "exactly_once_meta", "host": f"sqlite:///{Path(home) / f'meta-{n}.db'}"}
            )
        # pyiceberg keys a SQL catalog's rows by catalog name, and IcebergHook names it after the connection.
        sink = {"kind": "iceberg", "sink_id": SINK_ID, "tables": ["bench.task_start"], "iceberg_conn_id": "bench"}
        epoch = 0
        for _ in range(args.rounds):
            for n, (name, tree) in enumerate(trees_p.items()):
                epoch += 1
                location = f"{table.location()}/data/_eo/epoch-{epoch}"
                pre = PreCommit(
                    sink_id=SINK_ID,
                    epoch=epoch,
                    write_id=f"00000000-0000-4000-8000-{epoch:012d}",
                    tables=[
                        TableWrite(
                            table="bench.task_start",
                            location=location,
                            data_files=write_files(table, location, 1, epoch=epoch),
                        )
                    ],
                )
                pre_path = Path(home) / f"pre-{epoch}.json"
                pre_path.write_bytes(pre.model_dump_json().encode())
                for step in ("persist", "commit"):
                    settings = Path(home) / f"settings-{epoch}-{step}.json"
                    settings.write_text(
                        json.dumps(
                            {
                                "dag": str(tree / "dags" / "hourly_events.py"),
                                "meta_conn_id": f"bench_meta_{n}",
                                "sink": sink,
                                "epoch": epoch,
                                "step": step,
                                "pre_commit": str(pre_path),
                            }
                        )
                    )
                    for phase, seconds in _start(tree, settings, env).items():
                        results[name][step][phase].append(seconds)
                    print(f"{name} {step} epoch {epoch} done", flush=True)
    medians = {
        name: {step: {phase: statistics.median(v) for phase, v in phases.items()} for step, phases in steps.items()}
        for name, steps in results.items()
    }
    payload: dict[str, Any] = {
        "rounds": args.rounds,
        "trees": {name: str(path) for name, path in trees_p.items()},
        "load_average": os.getloadavg(),
        "median_s": medians,
        "provider_s": {
            name: {step: sum(v for p, v in phases.items() if p != "airflow_sdk") for step, phases in steps.items()}
            for name, steps in medians.items()
        },
        "samples_s": results,
    }
    path = save(args.name, payload)
    _plot(medians, RESULTS / f"{args.name}.png")
    print(json.dumps({"median_s": medians, "provider_s": payload["provider_s"]}, indent=1))
    print(f"wrote {path}")
    return 0


def _plot(medians: dict[str, dict[str, dict[str, float]]], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(8, 4))
    labels = [f"{name}\n{step}" for name, steps in medians.items() for step in steps]
    bottoms = [0.0] * len(labels)
    for phase in PHASES:
        values = [steps[step][phase] for steps in medians.values() for step in steps]
        ax.bar(labels, values, bottom=bottoms, label=phase)
        bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]
    ax.set_ylabel("seconds (median)")
    ax.set_title("one task start of an epoch, by phase")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
