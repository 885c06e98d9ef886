"""``DataFiles``: a write's files known by number, rows, bytes and paths before any descriptor is
parsed, read whole and checked against those paths when one is."""

from __future__ import annotations

import copy
import pickle

import pytest

from airflow_provider_exactly_once.core.data_file_list import DataFiles
from airflow_provider_exactly_once.core.errors import InvalidPreCommit
from airflow_provider_exactly_once.core.precommit import DataFileDescriptor, PreCommit
from tests.support.builders import make_pre_commit


def _unread(pre: PreCommit, loads: list[int], paths: list[str] | None = None) -> DataFiles:
    written = pre.tables[0].data_files

    def load() -> list[DataFileDescriptor]:
        loads.append(1)
        return list(written)

    return DataFiles.unread(
        count=len(written),
        records=written.record_count(),
        size=written.size_in_bytes(),
        paths=paths if paths is not None else list(written.paths()),
        load=load,
    )


def test_an_unread_write_is_read_once_when_a_descriptor_is_and_serialises_whole() -> None:
    pre = make_pre_commit("s", 1, files=5)
    loads: list[int] = []
    files = _unread(pre, loads)
    assert (len(files), bool(files), files.read, loads) == (5, True, False, [])
    assert repr(files) == "DataFiles(5 files, unread)"
    lazy = pre.model_copy(update={"tables": [pre.tables[0].model_copy(update={"data_files": files})]})
    assert lazy.record_count == pre.record_count and loads == []
    assert lazy.to_json() == pre.to_json() and loads == [1]  # serialising reads them
    assert list(files) == list(pre.tables[0].data_files) and files == pre.tables[0].data_files and loads == [1]
    assert PreCommit.from_json(lazy.to_json()) == pre
    assert pickle.loads(pickle.dumps(_unread(pre, []))) == files and copy.deepcopy(lazy) == pre


def test_descriptors_that_are_not_the_files_listed_are_refused() -> None:
    pre = make_pre_commit("s", 1, files=3)
    paths = list(pre.tables[0].data_files.paths())
    files = _unread(pre, [], paths=[*paths[:2], paths[2] + ".other"])
    with pytest.raises(InvalidPreCommit, match="not the 3 files listed with the write"):
        files[0]
    with pytest.raises(ValueError, match="3 data files with 2 paths"):
        _unread(pre, [], paths=paths[:2])


def test_a_list_validates_into_data_files_and_a_bad_descriptor_is_named() -> None:
    pre = make_pre_commit("s", 1, files=2)
    data = pre.model_dump(mode="json")
    assert isinstance(PreCommit.parse(data).tables[0].data_files, DataFiles)
    data["tables"][0]["data_files"][1]["record_count"] = -1
    with pytest.raises(Exception, match=r"tables\.0\.data_files\.1\.record_count"):
        PreCommit.parse(data)
