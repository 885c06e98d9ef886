"""The existence check of a write's files on a local disk (``catalog_access.missing_files``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyiceberg.io.pyarrow import PyArrowFileIO

from airflow_provider_exactly_once.sinks.iceberg.catalog_access import missing_files


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    write = tmp_path / "_eo" / "w"
    write.mkdir(parents=True)
    for n in range(4):
        (write / f"part-{n}.parquet").write_bytes(b"x")
    (write / "p=1").mkdir()
    (write / "p=1" / "part-9.parquet").write_bytes(b"x")
    return write


@pytest.mark.parametrize("scheme", ["file://", ""])
def test_files_directly_in_the_location_are_found_by_one_listing(folder: Path, scheme: str) -> None:
    under = f"{scheme}{folder}"
    paths = [f"{under}/part-{n}.parquet" for n in (3, 0, 7, 1, 5)]
    assert missing_files(PyArrowFileIO(), paths, under=under) == [paths[2], paths[4]]  # in the order given
    assert missing_files(PyArrowFileIO(), paths[:2], under=under + "/") == []
    (folder / "part-3.parquet").unlink()
    assert missing_files(PyArrowFileIO(), paths, under=under) == [paths[0], paths[2], paths[4]]


def test_a_location_that_is_not_there_misses_every_file(folder: Path) -> None:
    under = f"file://{folder}-gone"
    paths = [f"{under}/part-0.parquet", f"{under}/part-1.parquet"]
    assert missing_files(PyArrowFileIO(), paths, under=under) == paths


def test_subfolders_and_paths_elsewhere_are_checked_as_before(folder: Path) -> None:
    """Not all directly in the location: per folder, as the general path does."""
    under = f"file://{folder}"
    paths = [f"{under}/p=1/part-9.parquet", f"{under}/part-0.parquet", f"{under}/p=2/part-0.parquet"]
    assert missing_files(PyArrowFileIO(), paths, under=under) == [paths[2]]
    outside = f"file://{folder.parent}/other/part-0.parquet"
    assert missing_files(PyArrowFileIO(), [paths[1], outside], under=under) == [outside]
    assert missing_files(PyArrowFileIO(), [f"{under}/p=1"], under=under) == []  # a folder's name is listed


def test_every_local_spelling_of_a_path_is_checked_by_its_folder(folder: Path) -> None:
    """Each folder's URL is parsed once, when first met: ``/x``, ``file:/x`` and ``file:///x`` name the
    same folder, each listed as its own, and a name is looked up only in its own folder's listing."""
    paths = [
        f"{folder}/part-0.parquet",
        f"file:{folder}/part-1.parquet",
        f"file://{folder}/part-2.parquet",
        f"file:{folder}/p=1/part-9.parquet",
        f"file:{folder}/p=1/part-0.parquet",  # in the location, not in p=1
        f"{folder}/part-9.parquet",  # in p=1, not in the location
    ]
    assert missing_files(PyArrowFileIO(), paths, under=f"file://{folder}") == paths[4:]
    assert missing_files(PyArrowFileIO(), paths) == paths[4:]
