"""The compatibility matrix: the package installed from its own metadata (a freshly built wheel, no
lock) into a fresh environment per cell, for each supported Airflow minor and Python version, with
and without the extras, plus one lowest-direct resolution. In each cell: provider registration and
every module's import (``compat_cell.py``, run outside the source tree), then the end-to-end DAG
tests with ``dag.test()`` (the Spark ones where ``[spark]`` is installed).

Run it as ``scripts/compat`` (``--help`` lists the options); ``--ci`` is the one cell CI runs.
Results: a JSON file and a Markdown table (``--write-docs`` puts the table into
docs/compatibility.md). Needs ``uv`` and the Python interpreters (found by ``uv python find``, or
under pyenv); downloads nothing but packages.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
AIRFLOW = {"3.1": ">=3.1.1,<3.2", "3.2": ">=3.2,<3.3", "3.3": ">=3.3,<3.4"}
PYTHONS = ("3.11", "3.12", "3.13")
ALL_EXTRAS = "spark,postgres,s3,glue,openlineage"
TEST_TOOLS = ("pytest>=8", "pytest-timeout>=2.3", "pytest-xdist>=3.6")
#: Spark's Connect client (a dependency of the Spark provider) unpacks into pyspark's own directory
#: and has no release for every pyspark: kept out, as the project's lock keeps it out (README).
OVERRIDES = 'pyspark-client ; sys_platform == "never"\n'
#: Pins that Airflow's own constraints files carry and a fresh resolution lacks, by Airflow minor:
#: without them Airflow itself fails, whatever is installed beside it (docs/compatibility.md). Airflow
#: 3.2.2's in-process execution API (``dag.test()``) fails with svcs 26 ("'State' object has no
#: attribute 'svcs_registry'") and with fastapi 0.165 ("Model 'TITerminalStatePayload' needs a
#: discriminator field"); Airflow 3.1.1 imports ``structlog.dev.Styles``, gone in structlog 25.5.
UPSTREAM_PINS = {"3.2": ("svcs<26", "fastapi<0.137")}
LOWEST_UPSTREAM_PINS = ("structlog<25.5",)
E2E = ("tests/task_groups/test_epoch_dags.py",)
E2E_SPARK = ("tests/dags/test_examples.py",)
#: What CI's cell runs of them, to stay within CI's time: the happy path, a failed checkpoint, a
#: rerun, the deferrable sensor, PostgreSQL, and the hourly example DAG with real spark-submit.
CI_SELECTION = "happy_path or failed_checkpoint or rerun_of_a_successful or deferrable_sensor_waits or import_cleanly or hourly_events"
DOC = ROOT / "docs" / "compatibility.md"
BEGIN, END = "<!-- matrix:begin -->", "<!-- matrix:end -->"


@dataclass
class Cell:
    airflow: str
    python: str
    extras: str  # "" for the base install
    resolution: str = "highest"
    status: str = "not run"
    seconds: dict[str, float] = field(default_factory=dict)
    resolved: dict[str, str] = field(default_factory=dict)
    detail: str = ""
    #: CI's cell runs a share of the DAG tests (``CI_SELECTION``): the locked run covers all of them.
    ci: bool = False
    #: ``--quick``: the same share of the DAG tests as CI's cell, in every cell.
    quick: bool = False

    @property
    def name(self) -> str:
        extras = "all-extras" if self.extras else "base"
        lowest = "-lowest" if self.resolution != "highest" else ""
        return f"af{self.airflow}-py{self.python}-{extras}{lowest}"


def find_python(version: str) -> str:
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
    found = subprocess.run(["uv", "python", "find", version], capture_output=True, text=True, env=env)
    if found.returncode == 0 and found.stdout.strip():
        path = found.stdout.strip()
        probe = subprocess.run(
            [path, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True, text=True
        )
        if probe.stdout.strip() == version:
            return path
    for candidate in sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{version}.*/bin/python{version}"))):
        return candidate
    raise SystemExit(f"no Python {version} here: install one (e.g. pyenv install {version}) or drop it with --python")


def run(cmd: list[str], log: Path, *, cwd: Path, env: dict[str, str] | None = None, timeout: float = 3600) -> int:
    with log.open("a", encoding="utf-8") as out:
        out.write(f"\n$ {' '.join(cmd)}   (in {cwd})\n")
        out.flush()
        try:
            return subprocess.run(
                cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=timeout
            ).returncode
        except subprocess.TimeoutExpired:
            out.write(f"timed out after {timeout:.0f} s\n")
            return 124


def wheel_requirements(wheel: Path, extras: str) -> list[str]:
    """The wheel's ``Requires-Dist`` for the base install and ``extras``, markers evaluated by uv."""
    import email
    import zipfile

    with zipfile.ZipFile(wheel) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        meta = email.message_from_bytes(zf.read(name))
    wanted = set(filter(None, extras.split(",")))
    out = []
    for requirement in meta.get_all("Requires-Dist") or []:
        spec, _, marker = requirement.partition(";")
        extra = marker.split("extra ==")[-1].strip().strip("'\"") if "extra ==" in marker else None
        if extra is None or extra in wanted:
            out.append(spec.strip())
    return out


def build_wheel(work: Path) -> Path:
    dist = work / "dist"
    subprocess.run(["uv", "build", "--wheel", "--out-dir", str(dist), str(ROOT)], check=True, capture_output=True)
    return next(dist.glob("*.whl"))


def run_cell(cell: Cell, wheel: Path, work: Path) -> Cell:
    base = work / cell.name
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    log = base / "cell.log"
    venv = base / "venv"
    python = venv / "bin" / "python"
    overrides = base / "overrides.txt"
    overrides.write_text(OVERRIDES, encoding="utf-8")
    pins = UPSTREAM_PINS.get(cell.airflow, ()) + (LOWEST_UPSTREAM_PINS if cell.resolution != "highest" else ())
    constraints = base / "constraints.txt"
    constraints.write_text("".join(f"{pin}\n" for pin in pins), encoding="utf-8")
    # lowest-direct lowers what is named on the command line: the wheel's own requirements are named
    # there too, so that it is the package's floors (not only the wheel and Airflow) that are tried.
    direct = base / "direct.txt"
    direct.write_text("".join(f"{r}\n" for r in wheel_requirements(wheel, cell.extras)), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "AIRFLOW_HOME")}
    # The cell's own bin first: spark-submit is the [spark] extra's, as on a worker.
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    steps: list[tuple[str, list[str], Path, float]] = [
        ("venv", ["uv", "venv", "--quiet", "--python", find_python(cell.python), str(venv)], base, 300),
        (
            "install",
            [
                "uv",
                "pip",
                "install",
                "--python",
                str(python),
                "--override",
                str(overrides),
                "--constraint",
                str(constraints),
                "--requirement",
                str(direct),
                "--resolution",
                cell.resolution,
                "--quiet",
                f"{wheel}[{cell.extras}]" if cell.extras else str(wheel),
                f"apache-airflow{AIRFLOW[cell.airflow]}",
                *TEST_TOOLS,
            ],
            base,
            1800,
        ),
        ("checks", [str(python), str(ROOT / "scripts" / "compat_cell.py")], base, 600),
    ]
    tests = list(E2E) + (list(E2E_SPARK) if "spark" in cell.extras.split(",") else [])
    selection = ["-k", CI_SELECTION] if cell.ci or cell.quick else []
    # Two workers, a test file each: the cell's wait is the spark-submit DAG file's, not the sum.
    workers = ["-n", "2", "--dist", "loadfile"]
    steps.append(
        (
            "e2e",
            [str(python), "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", *workers, *tests, *selection],
            ROOT,
            2400,
        )
    )
    cell.status = "pass"
    for name, cmd, cwd, timeout in steps:
        started = time.monotonic()
        code = run(cmd, log, cwd=cwd, env=env, timeout=timeout)
        cell.seconds[name] = round(time.monotonic() - started, 1)
        if code != 0:
            cell.status = "fail"
            cell.detail = f"{name} exited {code} (see {log})"
            break
    if python.exists():
        listing = subprocess.run(
            ["uv", "pip", "list", "--python", str(python), "--format", "json"], capture_output=True, text=True
        )
        if listing.returncode == 0:
            wanted = {
                "apache-airflow",
                "apache-airflow-task-sdk",
                "pyspark",
                "pyiceberg",
                "sqlalchemy",
                "pydantic",
                "apache-airflow-providers-apache-spark",
                "apache-airflow-providers-apache-iceberg",
            }
            cell.resolved = {p["name"]: p["version"] for p in json.loads(listing.stdout) if p["name"].lower() in wanted}
    return cell


def record(cells: list[Cell], args: argparse.Namespace) -> None:
    if args.json:
        args.json.write_text(json.dumps([asdict(c) for c in cells], indent=2) + "\n", encoding="utf-8")
    if args.write_docs:
        text = DOC.read_text(encoding="utf-8")
        head, _, rest = text.partition(BEGIN)
        _, _, tail = rest.partition(END)
        DOC.write_text(f"{head}{BEGIN}\n{table(cells)}\n{END}{tail}", encoding="utf-8")


def table(cells: list[Cell]) -> str:
    lines = [
        "| cell | Airflow | Python | extras | resolution | result | install | checks | e2e tests | resolved |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        resolved = ", ".join(f"{k} {v}" for k, v in sorted(c.resolved.items()))
        secs = [f"{c.seconds[s]:.0f} s" if s in c.seconds else "-" for s in ("install", "checks", "e2e")]
        lines.append(
            f"| {c.name} | {c.airflow} | {c.python} | {c.extras or 'none'} | {c.resolution} | {c.status} | "
            + " | ".join(secs)
            + f" | {resolved} |"
        )
    return "\n".join(lines)


def plan(args: argparse.Namespace) -> list[Cell]:
    if args.ci:
        return [Cell("3.1", "3.12", ALL_EXTRAS, ci=True)]
    if args.lowest_only:
        return [Cell("3.1", "3.11", ALL_EXTRAS, resolution="lowest-direct", quick=args.quick)]
    cells = [
        Cell(airflow, python, extras)
        for airflow in args.airflow
        for python in args.python
        for extras in ((ALL_EXTRAS, "") if args.extras == "both" else (ALL_EXTRAS,) if args.extras == "all" else ("",))
    ]
    if args.lowest:
        cells.append(Cell("3.1", "3.11", ALL_EXTRAS, resolution="lowest-direct"))
    for cell in cells:
        cell.quick = args.quick
    return spread(cells)


def spread(cells: list[Cell]) -> list[Cell]:
    """Each Airflow minor, Python version and install kind early on, so that a run cut short still
    says something about each of them."""
    seen: dict[str, int] = {}
    ordered: list[Cell] = []
    pool = list(cells)
    while pool:
        best = min(pool, key=lambda c: (max(seen.get(c.airflow, 0), seen.get(c.python, 0)), c.resolution == "highest"))
        pool.remove(best)
        ordered.append(best)
        kind = "base" if not best.extras else "extras"
        for key in (best.airflow, best.python, kind):
            seen[key] = seen.get(key, 0) + 1
    return ordered


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/compat", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--airflow", nargs="+", default=list(AIRFLOW), choices=list(AIRFLOW))
    parser.add_argument("--python", nargs="+", default=list(PYTHONS), choices=list(PYTHONS))
    parser.add_argument("--extras", choices=("both", "all", "none"), default="both")
    parser.add_argument("--no-lowest", dest="lowest", action="store_false", help="leave out the lowest-direct cell")
    parser.add_argument(
        "--ci", action="store_true", help="only the cell CI runs: Airflow 3.1, Python 3.12, every extra"
    )
    parser.add_argument("--lowest-only", action="store_true", help="only the lowest-direct cell")
    parser.add_argument("--quick", action="store_true", help="in every cell, only the DAG tests CI's cell runs")
    parser.add_argument(
        "--work", type=Path, default=None, help="where the cells' environments go (default: a temporary directory)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the environments and logs")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--write-docs", action="store_true", help=f"put the table into {DOC.relative_to(ROOT)}")
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="eo-compat-"))
    work.mkdir(parents=True, exist_ok=True)
    cells = plan(args)
    wheel = build_wheel(work)
    print(f"{len(cells)} cell(s), wheel {wheel.name}, under {work}", flush=True)
    done: list[Cell] = []
    for cell in cells:
        done.append(run_cell(cell, wheel, work))
        print(f"{cell.name}: {cell.status} {cell.seconds} {cell.detail}", flush=True)
        record(done, args)  # after every cell: a run cut short still leaves its results
    print(table(done))
    failed = [c for c in cells if c.status != "pass"]
    if failed and not args.keep:
        print("failed cells keep their logs under", work)
    elif not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
