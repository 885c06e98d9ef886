"""Checkpoints as marker objects at a templated path (design.md section 7).

The upstream (a batch job, Hadoop's output committer, a data-quality gate) says an epoch's input
is final by writing ``_SUCCESS`` into the epoch's folder, or that it never will be by writing
``_FAILED``. Write-audit-publish is this with the audit as the upstream.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from airflow_provider_exactly_once.core.errors import InvalidSinkConfig
from airflow_provider_exactly_once.core.status import CheckpointStatus
from airflow_provider_exactly_once.filesystems import FsLookup, PathTemplate, refuse_credentials

__all__ = ["MarkerFileCheckpointSource"]

TEMPLATE_FIELDS = ("sink_id", "epoch", "start")


class MarkerFileCheckpointSource:
    """``CheckpointSource`` reading ``<path_template>/_SUCCESS`` and ``<path_template>/_FAILED``.

    ``path_template`` is a local path or fsspec URL with the fields ``{sink_id}``, ``{epoch}`` and
    ``{start}`` (the epoch's start as a UTC datetime), e.g.
    ``s3://lake/landing/{sink_id}/{start:%Y/%m/%d/%H}``. It must name the epoch through ``{epoch}``
    or ``{start}``: otherwise one marker would complete every epoch at once.

    A ``_FAILED`` marker wins over ``_SUCCESS`` (an audit may fail a load that had succeeded), and
    is looked for first. Both answers are final, so an upstream must write ``_FAILED`` before the
    epoch's ``_SUCCESS`` ever appears, never after it has been read.
    """

    def __init__(
        self,
        path_template: str,
        *,
        success_marker: str = "_SUCCESS",
        failed_marker: str = "_FAILED",
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        refuse_credentials(path_template, what="checkpoint path_template")
        self._template = PathTemplate(path_template, allowed=TEMPLATE_FIELDS, what="checkpoint path_template")
        if not self._template.fields & {"epoch", "start"}:
            raise InvalidSinkConfig(
                f"checkpoint path_template {path_template!r} uses neither {{epoch}} nor {{start}}: "
                "every epoch would share one marker"
            )
        for what, marker in (("success_marker", success_marker), ("failed_marker", failed_marker)):
            if not isinstance(marker, str) or not marker or "/" in marker or marker in (".", ".."):
                raise InvalidSinkConfig(f"{what} must be a plain file name, got {marker!r}")
        if success_marker == failed_marker:
            raise InvalidSinkConfig(f"success_marker and failed_marker are both {success_marker!r}")
        self.success_marker = success_marker
        self.failed_marker = failed_marker
        self._lookup = FsLookup(self._template.sample, storage_options, what="marker checkpoint source")

    @property
    def path_template(self) -> str:
        return self._template.template

    def location(self, sink_id: str, epoch: int) -> str:
        """The folder whose markers decide this epoch (as the template renders it)."""
        return self._template.render(sink_id, epoch)

    def marker_paths(self, sink_id: str, epoch: int) -> tuple[str, str]:
        """``(failed, success)`` marker paths on the filesystem, in the order they are read."""
        folder = self._lookup.path(self.location(sink_id, epoch))
        return f"{folder}/{self.failed_marker}", f"{folder}/{self.success_marker}"

    def status(self, sink_id: str, epoch: int) -> CheckpointStatus:
        failed, success = self.marker_paths(sink_id, epoch)
        if self._lookup.exists(failed):
            return CheckpointStatus.FAILED
        if self._lookup.exists(success):
            return CheckpointStatus.COMPLETED
        return CheckpointStatus.PENDING

    async def astatus(self, sink_id: str, epoch: int) -> CheckpointStatus:
        """Awaits the filesystem's own async API where it has one; else a worker thread."""
        if not self._lookup.is_async:
            return await asyncio.to_thread(self.status, sink_id, epoch)
        failed, success = self.marker_paths(sink_id, epoch)
        if await self._lookup.aexists(failed):
            return CheckpointStatus.FAILED
        if await self._lookup.aexists(success):
            return CheckpointStatus.COMPLETED
        return CheckpointStatus.PENDING

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path_template!r})"
