"""A missing extra or an unsupported version is one clear error, raised where the feature is used.

The locked environment has every extra, so a missing one is made here by blocking its module
(``sys.modules[name] = None`` makes its import fail as an uninstalled package's does); the compatibility
matrix (``scripts/compat``) checks the same in real environments without them.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_provider_exactly_once.core.errors import InvalidSinkConfig
from airflow_provider_exactly_once.extras import MissingExtra, require, url_to_fs
from airflow_provider_exactly_once.operators import spark_precommit
from airflow_provider_exactly_once.store.database import MetaStoreDatabase
from airflow_provider_exactly_once.version_compat import check_airflow_version


def test_require_names_the_extra_and_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg2", None)
    with pytest.raises(MissingExtra) as caught:
        require("psycopg2", extra="postgres", feature="a meta store on PostgreSQL")
    assert caught.value.extra == "postgres"
    assert str(caught.value) == (
        "a meta store on PostgreSQL needs the [postgres] extra (psycopg2 is not installed): "
        "pip install 'airflow-provider-exactly-once[postgres]'"
    )
    assert isinstance(caught.value, ImportError)  # optional integrations that catch ImportError still degrade


def test_require_returns_an_installed_module_and_refuses_an_unknown_extra() -> None:
    assert require("json", extra="spark", feature="x").__name__ == "json"
    with pytest.raises(ValueError, match="unknown extra 'sparkle'"):
        require("json", extra="sparkle", feature="x")


def test_a_module_whose_own_import_is_missing_is_not_blamed_on_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "half_installed.py").write_text("import no_such_dependency_anywhere\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError) as caught:
        require("half_installed", extra="spark", feature="x")
    assert not isinstance(caught.value, MissingExtra) and caught.value.name == "no_such_dependency_anywhere"


def test_a_postgresql_meta_store_without_the_driver_names_the_postgres_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg2", None)
    with pytest.raises(MissingExtra, match=r"needs the \[postgres\] extra"):
        MetaStoreDatabase("postgresql+psycopg2://eo@127.0.0.1:1/none")


def test_an_s3_path_without_s3fs_names_the_s3_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = importlib.import_module("fsspec.registry")  # the module: ``fsspec.registry`` is its mapping
    monkeypatch.setitem(sys.modules, "s3fs", None)
    for protocol in ("s3", "s3a"):
        monkeypatch.delitem(registry._registry, protocol, raising=False)
    with pytest.raises(
        MissingExtra, match=r"file sink root 's3://b/x' needs the \[s3\] extra \(s3fs is not installed\)"
    ):
        url_to_fs("s3://b/x", None, feature="file sink root 's3://b/x'")
    _fs, path = url_to_fs("file:///tmp/x", None, feature="x")  # other filesystems are untouched
    assert path == "/tmp/x"


def test_a_write_task_without_spark_submit_names_both_remedies() -> None:
    with pytest.raises(InvalidSinkConfig) as caught:
        spark_precommit.check_spark_submit("write", "spark3-submit-not-here", "spark_default")
    message = str(caught.value)
    assert "no 'spark3-submit-not-here' on this worker's PATH" in message and "'spark_default'" in message
    assert (
        "pip install 'airflow-provider-exactly-once[spark]'" in message
        and "bin/ directory on the worker's PATH" in message
    )


def test_pyspark_files_of_another_release_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "pyspark"
    package.mkdir()
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / "version.py").write_text('__version__: str = "4.2.0"\n', encoding="utf-8")
    monkeypatch.setattr(
        spark_precommit.util, "find_spec", lambda name: type("S", (), {"origin": str(package / "__init__.py")})()
    )
    monkeypatch.setattr(spark_precommit.metadata, "version", lambda name: "4.3.0")
    with pytest.raises(InvalidSinkConfig, match=r"pyspark 4.3.0 holds the Python files of release 4.2.0"):
        spark_precommit.check_pyspark_files()
    monkeypatch.setattr(spark_precommit.metadata, "version", lambda name: "4.2.0")
    spark_precommit.check_pyspark_files()  # the same release: nothing to say


def test_the_installed_pyspark_is_whole() -> None:
    spark_precommit.check_pyspark_files()


@pytest.mark.parametrize("version", ["3.0.6", "3.1.0", "3.4.0", "3.4.0.dev0", "2.11.1"])
def test_an_airflow_outside_the_range_is_refused_naming_it(version: str) -> None:
    with pytest.raises(ImportError, match=rf"supports Apache Airflow >=3.1.1,<3.4, not {version}"):
        check_airflow_version(version)


@pytest.mark.parametrize("version", ["3.1.1", "3.2.0", "3.3.2", "3.3.0rc1"])
def test_supported_airflow_releases_pass(version: str) -> None:
    assert check_airflow_version(version).release[:2] in ((3, 1), (3, 2), (3, 3))


def test_an_unsupported_python_is_refused_at_import_naming_the_range() -> None:
    code = "import sys; sys.version_info = (3, 14, 0, 'final', 0); import airflow_provider_exactly_once"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "supports Python 3.11 to 3.13, not 3.14" in done.stderr
