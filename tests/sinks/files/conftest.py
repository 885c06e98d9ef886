"""Fixtures of the file-sink suite: a local sink root and a unique in-memory one."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest

from airflow_provider_exactly_once.sinks.files import FileSinkCommitter


@pytest.fixture
def sink_root(tmp_path: Path) -> Path:
    return tmp_path / "sink"


@pytest.fixture
def committer(sink_root: Path) -> FileSinkCommitter:
    return FileSinkCommitter(str(sink_root))


@pytest.fixture
def memory_root() -> Iterator[str]:
    """A root on fsspec's process-wide memory filesystem, removed afterwards."""
    base = f"memory://eo-tests/{uuid.uuid4().hex}"
    yield f"{base}/sink"
    fs = fsspec.filesystem("memory")
    if fs.exists(base):
        fs.rm(base, recursive=True)
