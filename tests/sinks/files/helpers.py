"""Stage real parquet files the way a Spark writer would, and describe them in a pre-commit."""

from __future__ import annotations

import io
import posixpath
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_provider_exactly_once.core.precommit import DataFileDescriptor, PartitionValue, PreCommit
from airflow_provider_exactly_once.sinks.files import FileSinkCommitter

EPOCH = 1_700_000_000_000


@dataclass
class StagedFile:
    ids: Sequence[int]
    partition: dict[str, PartitionValue] = field(default_factory=dict)
    writer: str | None = None


def stage_write(
    committer: FileSinkCommitter,
    files: Sequence[StagedFile],
    *,
    sink_id: str = "files-sink",
    epoch: int = EPOCH,
    write_id: str | None = None,
) -> PreCommit:
    """Write each file as parquet into the write's staging folder and return its pre-commit."""
    write_id = write_id or str(uuid.uuid4())
    location = committer.staging_location(write_id)
    fs = committer.filesystem
    descriptors = []
    for i, spec in enumerate(files):
        url = f"{location}/task-{spec.writer or 0}/part-{i:05d}-{uuid.uuid4().hex[:8]}.parquet"
        buffer = io.BytesIO()
        pq.write_table(pa.table({"id": pa.array(list(spec.ids), pa.int64())}), buffer)
        data = buffer.getvalue()
        path = fs._strip_protocol(url)
        fs.makedirs(posixpath.dirname(path), exist_ok=True)
        fs.pipe_file(path, data)
        descriptors.append(
            DataFileDescriptor(
                path=url,
                record_count=len(spec.ids),
                file_size_in_bytes=len(data),
                partition=dict(spec.partition),
                writer=spec.writer,
            )
        )
    return PreCommit(
        sink_id=sink_id,
        epoch=epoch,
        write_id=write_id,
        tables=[committer.table_write(write_id, descriptors)],
    )


def _files(committer: FileSinkCommitter, path: str) -> list[str]:
    """Files only, listed afresh: an object store may list an emptied folder as an entry of its own."""
    fs = committer.filesystem
    fs.invalidate_cache(path)
    return sorted(name for name, info in fs.find(path, detail=True).items() if info.get("type") != "directory")


def final_files(committer: FileSinkCommitter) -> list[str]:
    """Every file under the root outside the staging folder, relative to the root, sorted."""
    root = committer.filesystem._strip_protocol(committer.root)
    found = [posixpath.relpath(p, root) for p in _files(committer, root)]
    return sorted(p for p in found if not p.startswith("_staging/"))


def staged_files(committer: FileSinkCommitter, pre_commit: PreCommit) -> list[str]:
    fs = committer.filesystem
    return _files(committer, fs._strip_protocol(committer.staging_location(pre_commit.write_id)))
