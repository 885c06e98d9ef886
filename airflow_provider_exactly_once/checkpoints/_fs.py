"""What the file-based checkpoint sources share: path templates and strict, cache-free look-ups.

Two things matter for a checkpoint read that ``fs.exists`` gets wrong:

* an unreachable store must be an error, not "absent": ``exists`` swallows every exception, and
  a sensor reading PENDING where the truth is COMPLETED merely waits, but one reading "no
  ``_FAILED``" during an outage could let a commit through;
* object-store filesystems cache listings, and a poller must never keep seeing the old answer, so
  every look-up invalidates the cache for its path first.
"""

from __future__ import annotations

import asyncio
import re
import string
from collections.abc import Collection, Mapping
from datetime import UTC, datetime
from typing import Any

import fsspec
from fsspec.asyn import AsyncFileSystem

from airflow_provider_exactly_once.core.epochs import epoch_start
from airflow_provider_exactly_once.core.errors import InvalidPreCommit, InvalidSinkConfig, SinkUnavailable
from airflow_provider_exactly_once.core.identifiers import check_epoch, check_sink_id
from airflow_provider_exactly_once.core.redact import has_userinfo, mask_userinfo

#: Sample values that every valid template must render with (validated at construction).
_SAMPLE = {"sink_id": "sink", "epoch": 1_700_000_000_000, "start": datetime(2023, 11, 14, 22, 13, tzinfo=UTC)}


def refuse_credentials(location: str, *, what: str) -> None:
    """A checkpoint location is registered with its sink and shown by the UI, eo-sink and the logs:
    credentials in it would be shown everywhere, so they belong in ``storage_options``."""
    if isinstance(location, str) and has_userinfo(location):
        raise InvalidSinkConfig(
            f"{what} {mask_userinfo(location)!r} holds credentials (user:password@); pass them in "
            "storage_options (e.g. {'key': ..., 'secret': ...}) or through the filesystem's Airflow "
            "connection, and keep the location plain"
        )


class PathTemplate:
    """A ``str.format`` template over ``{sink_id}``, ``{epoch}`` and ``{start}``, checked up front.

    ``start`` is the epoch as a UTC datetime, so ``{start:%Y/%m/%d/%H}`` names hourly folders.
    """

    def __init__(self, template: str, *, allowed: Collection[str], what: str) -> None:
        if not isinstance(template, str) or not template.strip():
            raise InvalidSinkConfig(f"{what} must be a non-empty string, got {template!r}")
        fields: set[str] = set()
        try:
            parsed = list(string.Formatter().parse(template))
        except ValueError as exc:
            raise InvalidSinkConfig(f"{what} {template!r} is not a valid template: {exc}") from None
        for _, field, _, _ in parsed:
            if field is None:
                continue
            name = re.split(r"[.\[]", field, maxsplit=1)[0]
            if not name or name.isdigit():
                raise InvalidSinkConfig(
                    f"{what} {template!r} has a positional field {{{field}}}; name it: {sorted(allowed)}"
                )
            if name not in allowed:
                raise InvalidSinkConfig(
                    f"{what} {template!r} has unknown field {{{name}}}; known fields: {sorted(allowed)}"
                )
            fields.add(name)
        self.template = template
        self.fields = frozenset(fields)
        self.what = what
        try:
            self.sample = template.format(**{k: v for k, v in _SAMPLE.items() if k in allowed})
        except (ValueError, TypeError, AttributeError, IndexError, KeyError) as exc:
            raise InvalidSinkConfig(f"{what} {template!r} cannot be rendered: {exc}") from None

    def render(self, sink_id: str, epoch: int) -> str:
        check_sink_id(sink_id)
        check_epoch(epoch)
        values: dict[str, Any] = {"sink_id": sink_id, "epoch": epoch}
        if "start" in self.fields:
            try:
                values["start"] = epoch_start(epoch)
            except (ValueError, OverflowError, OSError):
                raise InvalidPreCommit(
                    f"epoch {epoch} is not an instant a datetime can hold, so {self.what} "
                    f"{self.template!r} cannot use {{start}}"
                ) from None
        return self.template.format(**values)


class FsLookup:
    """Strict existence checks and listings on one fsspec filesystem, sync and async."""

    def __init__(self, sample_url: str, storage_options: Mapping[str, Any] | None, *, what: str) -> None:
        try:
            fs, _ = fsspec.core.url_to_fs(sample_url, **dict(storage_options or {}))
        except (ValueError, ImportError, TypeError) as exc:
            raise InvalidSinkConfig(mask_userinfo(f"{what} {sample_url!r}: cannot open its filesystem: {exc}")) from exc
        self.fs: Any = fs
        self._what = what

    def path(self, url: str) -> str:
        return str(self.fs._strip_protocol(url)).rstrip("/")

    @property
    def is_async(self) -> bool:
        """Whether the filesystem has a native async API we can await without a worker thread."""
        return bool(getattr(self.fs, "async_impl", False)) and isinstance(self.fs, AsyncFileSystem)

    def exists(self, path: str) -> bool:
        self.fs.invalidate_cache(path)
        try:
            self.fs.info(path)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise self._unavailable(path, exc) from exc
        return True

    def listdir(self, path: str) -> list[str]:
        """Base names in a folder; a missing folder is empty."""
        self.fs.invalidate_cache(path)
        try:
            entries = self.fs.ls(path, detail=False)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise self._unavailable(path, exc) from exc
        return [str(entry).rstrip("/").rsplit("/", 1)[-1] for entry in entries]

    async def aexists(self, path: str) -> bool:
        self.fs.invalidate_cache(path)
        try:
            await self._on_fs_loop(self.fs._info(path))
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise self._unavailable(path, exc) from exc
        return True

    async def alistdir(self, path: str) -> list[str]:
        self.fs.invalidate_cache(path)
        try:
            entries = await self._on_fs_loop(self.fs._ls(path, detail=False))
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise self._unavailable(path, exc) from exc
        return [str(entry).rstrip("/").rsplit("/", 1)[-1] for entry in entries]

    async def _on_fs_loop(self, coroutine: Any) -> Any:
        """Run one of the filesystem's coroutines where its sessions live.

        A filesystem made in the usual (synchronous) mode keeps its sessions on fsspec's own IO
        loop; awaiting its coroutines on the caller's loop (the triggerer's) would cross loops.
        Handing the coroutine to that loop and awaiting the future blocks no thread.
        """
        if getattr(self.fs, "asynchronous", False):
            return await coroutine
        future = asyncio.run_coroutine_threadsafe(coroutine, self.fs.loop)
        return await asyncio.wrap_future(future)

    def _unavailable(self, path: str, exc: BaseException) -> SinkUnavailable:
        return SinkUnavailable(mask_userinfo(f"{self._what}: cannot look up {path!r}: {exc}"))
