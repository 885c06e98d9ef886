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
