"""What a DAG file of ours costs the dag-processor at every parse, against the same DAG shape made
of ``EmptyOperator``s. The target (issue 32, restating issue 18's): the package adds at most 20 ms to
each parse as the dag-processor parses (the ``package_adds_ms`` figure); the ratio is reported, not a
target.

Each measurement is a fresh interpreter that has already imported ``airflow.sdk`` (as the
dag-processor's parsing process has) and then runs the DAG file: the time of that run is what the
file adds, its own imports included. The twin has the example's dag id, task ids, dependencies and
schedule (the same timetable class, built from its serialized form), generated from the parsed
example: what is left between the two is what the provider's operators and configs cost. Pairs are interleaved (ours, twin, ours, twin, ...) and the
ratio is of the medians, measured in the same run. Also recorded: which heavy libraries the
example's parse loads beyond what ``airflow.sdk`` already loaded.

The sources are compiled to bytecode first (``bench._bytecode``), as an installed deployment's are.

A second pair of runs parses both files as Airflow 3's dag-processor does: its manager imports the
``airflow.*`` modules a DAG file names (``[dag_processor] parsing_pre_import_modules``, on by default,
with Airflow's own ``iter_airflow_imports``) before it forks the process that parses the file, so
those cost nothing at each parse. The twin's timetable module is one of them; the package's modules
are not (their names do not start with ``airflow.``). That pair gives what the package itself adds to
every parse, in milliseconds.

    uv run python -m bench.dag_parse [--rounds 7] [--dag dags/hourly_events.py] [--tree PATH --name NAME]

``--tree`` parses the DAG of another checkout of this repository with its own package (an earlier
commit, for a before-and-after in the same conditions), in this environment.
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

from bench._bytecode import compile_bytecode
from bench._world import RESULTS, save, tree_named

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("pyiceberg", "pyarrow", "pyspark", "pandas", "numpy", "sqlalchemy", "pydantic", "fsspec", "alembic", "s3fs")

#: Run in a child: import what the dag-processor has, then time the DAG file; print JSON.
CHILD = """
import json, runpy, sys, time
import airflow.sdk  # noqa: F401  the parsing process has the SDK already
if sys.argv[2:] == ['pre-import']:
    from importlib import import_module
    from airflow.utils.file import iter_airflow_imports
    for module in iter_airflow_imports(sys.argv[1]):
        import_module(module)
before = {m.split('.')[0] for m in sys.modules}
ours = {m for m in sys.modules if m.startswith('airflow_provider_exactly_once')}
start = time.perf_counter()
namespace = runpy.run_path(sys.argv[1])
elapsed = time.perf_counter() - start
after = {m.split('.')[0] for m in sys.modules}
mine = sorted(m for m in sys.modules if m.startswith('airflow_provider_exactly_once') and m not in ours)
package = sys.modules['airflow_provider_exactly_once'].__file__ if mine else None
dags = [v for v in namespace.values() if type(v).__name__ == 'DAG']
shape = {t.task_id: sorted(t.upstream_task_ids) for d in dags for t in d.tasks}
timetables = [[type(d.timetable).__module__, type(d.timetable).__qualname__, d.timetable.serialize()] for d in dags]
print(json.dumps({'seconds': elapsed, 'new_top_level': sorted(after - before), 'modules_of_ours': mine,
                  'dag_ids': [d.dag_id for d in dags], 'shape': shape, 'timetables': timetables,
                  'package': package}))
"""


def parse_once(path: Path, env: dict[str, str], tree: Path = ROOT, *, pre_import: bool = False) -> dict[str, Any]:
    """One parse in a fresh interpreter run in ``tree``: ``python -c`` puts its working directory
    first on ``sys.path``, ahead of ``PYTHONPATH``, so that is where the package comes from.
    ``pre_import``: the file's ``airflow.*`` imports are done first, as the dag-processor's manager does."""
    argv = [sys.executable, "-c", CHILD, str(path), *(["pre-import"] if pre_import else [])]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, cwd=tree)
    if done.returncode != 0:
        raise RuntimeError(f"parsing {path} failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def twin_source(dag_id: str, shape: dict[str, list[str]], timetable: list[object]) -> str:
    """The same dag id, task ids, edges and timetable, every task an ``EmptyOperator``."""
    module, name, data = timetable
    return (
        "import datetime as dt\n"
        f"from {module} import {name}\n"  # a static import, which the dag-processor pre-imports as it does ours
        "from airflow.sdk import DAG\n"
        "from airflow.providers.standard.operators.empty import EmptyOperator\n"
        f"SHAPE = {shape!r}\n"
        f"schedule = {name}.deserialize({data!r})\n"
        f"with DAG({dag_id!r}, schedule=schedule, start_date=dt.datetime(2024, 1, 1), catchup=False) as dag:\n"
        "    tasks = {task_id: EmptyOperator(task_id=task_id.replace('.', '__')) for task_id in SHAPE}\n"
        "    for task_id, upstream in SHAPE.items():\n"
        "        for up in upstream:\n"
        "            tasks[up] >> tasks[task_id]\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.dag_parse", description=__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--dag", type=Path, default=None, help="default: the tree's dags/hourly_events.py")
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose package and DAG are parsed")
    parser.add_argument("--name", default="dag_parse", help="result file name (without extension)")
    args = parser.parse_args(argv)
    tree = args.tree.resolve()
    dag = (args.dag or tree / "dags" / "hourly_events.py").resolve()
    compile_bytecode(tree / "airflow_provider_exactly_once", tree / "dags")
    with tempfile.TemporaryDirectory(prefix="eo-parse-") as home:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "EO_EXAMPLES"))}
        env.update({"AIRFLOW_HOME": home, "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "PYTHONPATH": str(tree)})
        first = parse_once(dag, env, tree)
        (dag_id,) = first["dag_ids"]
        twin = Path(home) / "twin.py"
        (timetable,) = first["timetables"]
        twin.write_text(twin_source(dag_id, first["shape"], timetable), encoding="utf-8")
        ours: list[float] = []
        empty: list[float] = []
        ours_pre: list[float] = []
        empty_pre: list[float] = []
        for _ in range(args.rounds):
            for pre_import, ours_list, empty_list in ((False, ours, empty), (True, ours_pre, empty_pre)):
                ours_list.append(float(parse_once(dag, env, tree, pre_import=pre_import)["seconds"]))
                empty_list.append(float(parse_once(twin, env, tree, pre_import=pre_import)["seconds"]))
    ratio = statistics.median(ours) / statistics.median(empty)
    as_processor = {
        "ours_s": ours_pre,
        "empty_operators_s": empty_pre,
        "median_ours_s": statistics.median(ours_pre),
        "median_empty_operators_s": statistics.median(empty_pre),
        "ratio": statistics.median(ours_pre) / statistics.median(empty_pre),
        "package_adds_ms": 1000 * (statistics.median(ours_pre) - statistics.median(empty_pre)),
    }
    heavy = sorted(set(first["new_top_level"]) & set(HEAVY))
    payload = {
        "dag": str(dag.relative_to(tree)),
        "tree": tree_named(tree),
        "tasks": len(first["shape"]),
        "rounds": args.rounds,
        "load_average": os.getloadavg(),
        "ours_s": ours,
        "empty_operators_s": empty,
        "median_ours_s": statistics.median(ours),
        "median_empty_operators_s": statistics.median(empty),
        "ratio": ratio,
        "heavy_libraries_loaded_by_the_parse": heavy,
        "as_the_dag_processor_parses": as_processor,
        "modules_of_ours_loaded": first["modules_of_ours"],
        "package": str(Path(first["package"]).relative_to(tree)) if first["package"] else None,
    }
    path = save(args.name, payload)
    fig, ax = plt.subplots(figsize=(8, 3.8))
    ax.boxplot(
        [ours, empty, ours_pre, empty_pre],
        tick_labels=[payload["dag"], "twin (EmptyOperator)", "ours, airflow.* pre-imported", "twin, pre-imported"],
    )
    ax.tick_params(axis="x", labelsize=7)
    ax.set_ylabel("seconds to run the DAG file (airflow.sdk loaded)")
    ax.set_title(
        f"DAG parse: {ratio:.2f}x of EmptyOperators; as the dag-processor parses: "
        f"{as_processor['ratio']:.1f}x, +{as_processor['package_adds_ms']:.1f} ms (median of {args.rounds})",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(RESULTS / f"{args.name}.png", dpi=120)
    print(
        json.dumps(
            {
                k: payload[k]
                for k in (
                    "median_ours_s",
                    "median_empty_operators_s",
                    "ratio",
                    "heavy_libraries_loaded_by_the_parse",
                    "as_the_dag_processor_parses",
                )
            }
        )
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
