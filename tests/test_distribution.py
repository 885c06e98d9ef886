"""The distribution as users get it: ``uv build`` gives a wheel and an sdist that pass
``twine check``, with the metadata Airflow's provider tooling and the resolver read, and a wheel
that ships the provider alone (no demo, test servers or fault reader); the wheel, not the source
tree, installed into a fresh virtual environment runs the example DAG (the repository's demo: real
``dag.test()`` runs and spark-submit) from a copy of the demo outside the checkout."""

from __future__ import annotations

import email
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import airflow_provider_exactly_once as eo
from tests.demo.test_demo import check_summary

REPO = Path(__file__).resolve().parents[1]
UV = shutil.which("uv")
pytestmark = pytest.mark.skipif(UV is None, reason="uv is not on PATH (scripts/test installs it)")


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([str(UV), "build", "--out-dir", str(out), str(REPO)], check=True, capture_output=True, timeout=600)
    return out


def wheel_of(dist: Path) -> Path:
    (wheel,) = dist.glob("*.whl")
    return wheel


def test_the_wheel_and_the_sdist_pass_twine_check(dist: Path) -> None:
    files = sorted([*dist.glob("*.tar.gz"), *dist.glob("*.whl")])
    assert [f.name.removesuffix(".tar.gz").split("-")[1] for f in files] == [eo.__version__] * 2
    done = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *map(str, files)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("PASSED") == 2


def test_the_wheel_metadata_states_the_supported_ranges_and_the_extras(dist: Path) -> None:
    wheel = wheel_of(dist)
    assert wheel.name.startswith(f"airflow_provider_exactly_once-{eo.__version__}-")
    with zipfile.ZipFile(wheel) as zf:
        (meta_name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        meta = email.message_from_bytes(zf.read(meta_name))
        entry_points = zf.read(meta_name.replace("METADATA", "entry_points.txt")).decode()
        names = zf.namelist()
    assert not [n for n in names if n.startswith(("tests/", "dags/", "bench/", "demo/", "fault_harness/"))]
    # The demo's test servers and the fault-plan reader stay beside the package, not in it.
    assert not [n for n in names if "/demo/" in n or "fault_plan" in n or n.endswith("runtime/faults.py")]
    assert "airflow_provider_exactly_once/runtime/assembly.py" in names
    assert meta["Version"] == eo.__version__
    assert meta["Requires-Python"] == "<3.14,>=3.11"
    assert "Framework :: Apache Airflow :: Provider" in meta.get_all("Classifier")
    assert {"Programming Language :: Python :: 3.11", "Programming Language :: Python :: 3.13"} <= set(
        meta.get_all("Classifier")
    )
    assert set(meta.get_all("Provides-Extra")) == {"spark", "postgres", "s3", "glue", "openlineage", "audit"}
    requires = meta.get_all("Requires-Dist")
    base = [r for r in requires if "extra ==" not in r]
    assert "apache-airflow<3.4,>=3.1.1" in base
    # A scheduler image need not carry Spark's jars, PostgreSQL's driver or the OpenLineage provider.
    assert not [r for r in base if r.startswith(("pyspark", "psycopg2", "apache-airflow-providers-openlineage"))]
    assert any(r.startswith("pyspark[sql]") and "extra == 'spark'" in r for r in requires)
    assert "apache_airflow_provider" in entry_points and "eo-sink" in entry_points


def demo_outside_the_checkout(where: Path, *, with_dags: bool = True) -> Path:
    """The repository's demo (with the fault reader it arms its crash with) copied into ``where``,
    laid out as in a checkout, with the example DAGs beside it unless ``with_dags`` is false."""
    skip = shutil.ignore_patterns("__pycache__")
    shutil.copytree(REPO / "demo", where / "demo", ignore=skip)
    if with_dags:
        shutil.copytree(REPO / "dags", where / "dags", ignore=skip)
    return where


@pytest.fixture(scope="module")
def fresh_env(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A new virtual environment holding the built wheel with ``[spark]``, at the lock's versions (so
    the test is about the wheel, not about today's PyPI; ``scripts/compat`` resolves freshly)."""
    base = tmp_path_factory.mktemp("fresh")
    venv = base / "venv"
    constraints = base / "constraints.txt"
    subprocess.run(
        [
            str(UV),
            "export",
            "--frozen",
            "--no-dev",
            "--extra",
            "spark",
            "--no-emit-project",
            "--no-hashes",
            "-o",
            str(constraints),
        ],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    overrides = base / "overrides.txt"
    overrides.write_text('pyspark-client ; sys_platform == "never"\n', encoding="utf-8")
    subprocess.run([str(UV), "venv", "--quiet", "--python", sys.executable, str(venv)], check=True, timeout=300)
    done = subprocess.run(
        [
            str(UV),
            "pip",
            "install",
            "--quiet",
            "--python",
            str(venv / "bin" / "python"),
            "-c",
            str(constraints),
            "--override",
            str(overrides),
            f"{wheel_of(dist)}[spark]",
        ],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    yield venv
    shutil.rmtree(base, ignore_errors=True)


@pytest.mark.spark
@pytest.mark.slow
# The demo's own 900 s, plus the fresh environment's install (the fixture counts against the first test).
@pytest.mark.timeout(1500)
def test_the_installed_wheel_runs_the_example_dag(fresh_env: Path, tmp_path: Path) -> None:
    """The demo on the local stack, as ``./scripts/demo`` runs it, but against the wheel: a copy of
    the demo and the example DAGs outside the checkout, the package from the fresh environment (its
    run from the source tree is the same code; the S3 stack's run in tests/demo stays there)."""
    python = fresh_env / "bin" / "python"
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AIRFLOW", "EO_EXAMPLES", "EXACTLY_ONCE", "VIRTUAL_ENV", "PYTHONPATH"))
    }
    env["PATH"] = f"{fresh_env / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    copy = demo_outside_the_checkout(tmp_path / "copy")
    where = subprocess.run(
        [
            str(python),
            "-c",
            "import airflow_provider_exactly_once as eo, demo; print(eo.__file__, eo.__version__, demo.__file__)",
        ],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    location, version, demo_location = where.stdout.split()
    assert Path(location).is_relative_to(fresh_env) and version == eo.__version__
    assert Path(demo_location).is_relative_to(copy)
    root = tmp_path / "demo-root"
    done = subprocess.run(
        [str(python), "-m", "demo", "--root", str(root), "--hours", "4"],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    check_summary(done, root)


def test_the_demo_against_the_wheel_without_the_example_dags_says_where_they_are(
    fresh_env: Path, tmp_path: Path
) -> None:
    copy = demo_outside_the_checkout(tmp_path / "copy", with_dags=False)
    done = subprocess.run(
        [str(fresh_env / "bin" / "python"), "-m", "demo", "--root", str(tmp_path / "d")],
        cwd=copy,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2
    assert "no example DAG hourly_events.py" in done.stderr and "--dags-folder" in done.stderr
