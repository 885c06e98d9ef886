"""Fixtures of the checkpoint-source suites, and a tiny natively-async fsspec filesystem.

The async filesystem stands in for s3fs/gcsfs/adlfs (which need a network): it is a real
``fsspec.asyn.AsyncFileSystem`` whose coroutines run on fsspec's IO loop, so the sources' async
path is exercised the way it runs against an object store.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any, ClassVar

import fsspec
import pytest
from fsspec.asyn import AsyncFileSystem


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "spark: starts a real local SparkSession (Java needed; ~20 s)")


class AsyncDictFileSystem(AsyncFileSystem):  # type: ignore[misc]
    """Files in a dict, served by coroutines; ``fail_with`` simulates an unreachable store."""

    protocol = "eoasync"
    files: ClassVar[dict[str, bytes]] = {}
    fail_with: ClassVar[BaseException | None] = None
    coroutine_threads: ClassVar[list[str]] = []

    def _check(self) -> None:
        self.coroutine_threads.append(threading.current_thread().name)
        if self.fail_with is not None:
            raise self.fail_with

    async def _info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        self._check()
        path = self._strip_protocol(path).rstrip("/")
        if path in self.files:
            return {"name": path, "size": len(self.files[path]), "type": "file"}
        if any(name.startswith(path + "/") for name in self.files):
            return {"name": path, "size": 0, "type": "directory"}
        raise FileNotFoundError(path)

    async def _ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        self._check()
        path = self._strip_protocol(path).rstrip("/")
        children = sorted(
            {path + "/" + n[len(path) + 1 :].split("/")[0] for n in self.files if n.startswith(path + "/")}
        )
        if not children:
            raise FileNotFoundError(path)
        return [await self._info(c) for c in children] if detail else children

    async def _pipe_file(self, path: str, value: bytes, **kwargs: Any) -> None:
        self.files[self._strip_protocol(path)] = value

    async def _cat_file(self, path: str, start: Any = None, end: Any = None, **kwargs: Any) -> bytes:
        return self.files[self._strip_protocol(path)][start:end]

    async def _rm_file(self, path: str, **kwargs: Any) -> None:
        self.files.pop(self._strip_protocol(path), None)

    async def _makedirs(self, path: str, exist_ok: bool = False) -> None:
        pass


fsspec.register_implementation("eoasync", AsyncDictFileSystem, clobber=True)


@pytest.fixture
def async_fs() -> Iterator[type[AsyncDictFileSystem]]:
    AsyncDictFileSystem.files.clear()
    AsyncDictFileSystem.fail_with = None
    AsyncDictFileSystem.coroutine_threads.clear()
    yield AsyncDictFileSystem
    AsyncDictFileSystem.files.clear()
    AsyncDictFileSystem.fail_with = None


@pytest.fixture
def memory_base() -> Iterator[str]:
    """A unique folder on fsspec's process-wide memory filesystem, removed afterwards."""
    base = f"memory://eo-checkpoints/{uuid.uuid4().hex}"
    yield base
    fs = fsspec.filesystem("memory")
    if fs.exists(base):
        fs.rm(base, recursive=True)
