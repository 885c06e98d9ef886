"""Small helpers shared by the checkpoint-source suites."""

from __future__ import annotations

import posixpath

import fsspec


def touch(url: str, data: bytes = b"") -> None:
    """Create a file (and its folders) at a local path or fsspec URL."""
    fs, path = fsspec.core.url_to_fs(url)
    fs.makedirs(posixpath.dirname(path), exist_ok=True)
    fs.pipe_file(path, data)
