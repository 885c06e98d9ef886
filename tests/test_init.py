"""The package root: one import for a DAG author, and importing it stays light."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import airflow_provider_exactly_once as eo


def test_importing_the_root_imports_neither_airflow_nor_spark_nor_pyiceberg() -> None:
    code = (
        "import json, sys; import airflow_provider_exactly_once as eo; "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('airflow', 'pyspark', 'pyiceberg'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


@pytest.mark.parametrize("name", eo.__all__)
def test_every_exported_name_resolves_to_its_own_module_object(name: str) -> None:
    value = getattr(eo, name)
    assert getattr(value, "__name__", name) == name
    assert name in dir(eo)


def test_the_exported_names_are_exactly_the_lazy_ones() -> None:
    assert sorted(eo.__all__) == sorted(eo._WHERE)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_thing"):
        eo.no_such_thing  # noqa: B018


#: What a DAG file must not pay for at every parse: the commit path's libraries, loaded by the tasks
#: that commit, never by the dag-processor. (SQLAlchemy and pydantic are imported by Airflow's SDK
#: itself, which the check below confirms; what the package adds of them is its own layer of models.)
HEAVY = ("pyiceberg", "pyarrow", "pandas", "numpy", "pyspark", "botocore", "aiohttp", "s3fs", "alembic", "duckdb")
#: The package's own heavy layers: the meta store's SQLAlchemy models and its hook, the pre-commit's
#: and the job spec's pydantic models (with the upsert settings), the coordinator, the committers,
#: recovery and the Spark application. The job spec and the hook load in the task that needs them.
OURS_HEAVY = (
    "airflow_provider_exactly_once.store",
    "airflow_provider_exactly_once.hooks.meta_store",
    "airflow_provider_exactly_once.spark.jobspec",
    "airflow_provider_exactly_once.core.upserts",
    "airflow_provider_exactly_once.core.precommit",
    "airflow_provider_exactly_once.core.coordinator",
    "airflow_provider_exactly_once.sinks.iceberg",
    "airflow_provider_exactly_once.sinks.files",
    "airflow_provider_exactly_once.recovery.sink",
    "airflow_provider_exactly_once.spark.epoch_writer",
)
#: Names that are functions run in tasks, not DAG-facing: ``ensure_table`` takes a catalog and
#: returns a pyiceberg ``Table``, so its module imports pyiceberg.
NEEDS_PYICEBERG = {"ensure_table"}
#: Names only an upsert sink's DAG resolves: they are the upsert settings' own pydantic models.
UPSERT_ONLY = {"UpsertSpec"}


def test_the_dag_facing_names_import_nothing_heavy_beyond_airflow() -> None:
    """In a fresh interpreter, after what any DAG imports (Airflow's SDK): resolving every DAG-facing
    name adds none of the heavy libraries, nor the Spark provider's operator (0.4 s here with
    OpenLineage's Spark integration, which the write operator imports only when its task runs)."""
    names = sorted(set(eo.__all__) - NEEDS_PYICEBERG - UPSERT_ONLY)
    code = (
        "import json, sys\n"
        "from airflow.sdk import DAG, BaseOperator\n"
        "before = {m.split('.')[0] for m in sys.modules}\n"
        "import airflow_provider_exactly_once as eo\n"
        f"for name in {names!r}: getattr(eo, name)\n"
        "import airflow_provider_exactly_once.operators as ops\n"
        "for name in ops.__all__: getattr(ops, name)\n"
        f"heavy = sorted({{m.split('.')[0] for m in sys.modules}} - before & set({HEAVY!r}))\n"
        f"ours = sorted(m for m in sys.modules if m.startswith({OURS_HEAVY!r}))\n"
        "spark = sorted(m for m in sys.modules if m.startswith('airflow.providers.apache.spark.operators'))\n"
        "print(json.dumps([heavy, ours, sorted({'sqlalchemy', 'pydantic'} - before), spark]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    heavy, ours, not_airflows, spark = json.loads(out.stdout.strip().splitlines()[-1])
    assert heavy == [] and ours == [] and spark == []
    assert not_airflows == []  # SQLAlchemy and pydantic were Airflow's before the package was imported


def test_the_heavy_check_sees_a_heavy_import() -> None:
    """The check above can fail: ``ensure_table`` does bring pyiceberg."""
    code = (
        "import json, sys\n"
        "import airflow_provider_exactly_once as eo\n"
        "eo.ensure_table\n"
        "print(json.dumps('pyiceberg' in {m.split('.')[0] for m in sys.modules}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert json.loads(out.stdout.strip().splitlines()[-1]) is True
