"""What the file-based checkpoint sources and the file sink share: path templates, strict and
cache-free look-ups, secrets kept out of serialised configs, and the configs' base (``ConfigModel``).

It imports no Airflow; the storage hook resolves a config's ``storage_conn_id`` (design.md D13).
The trap it avoids: ``fs.exists`` swallows every exception and object-store filesystems cache
listings, so an outage could read as "no ``_FAILED``" and let a commit through, and a poller could
keep seeing an old answer; ``store_errors()`` also names botocore's ``EndpointConnectionError``
(no ``OSError``), and every look-up invalidates the cache for its path first.
"""

from __future__ import annotations

import asyncio
import functools
import re
import string
from collections.abc import Collection, Mapping
from datetime import UTC, datetime
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError

from airflow_provider_exactly_once.core.epochs import check_epoch, epoch_start
from airflow_provider_exactly_once.core.errors import (
    InvalidPreCommit,
    InvalidSinkConfig,
    SinkUnavailable,
    has_userinfo,
    mask_userinfo,
)
from airflow_provider_exactly_once.extras import url_to_fs

#: Sample values that every valid template must render with (validated at construction).
_SAMPLE = {"sink_id": "sink", "epoch": 1_700_000_000_000, "start": datetime(2023, 11, 14, 22, 13, tzinfo=UTC)}


@functools.cache
def store_errors() -> tuple[type[BaseException], ...]:
    """What a filesystem raises when the store could not answer (checked after ``FileNotFoundError``):
    ``OSError`` plus the transport errors of the object-store clients that are installed.

    A function, called only once an exception is being matched: botocore and aiohttp take half a
    second to import, and DAG files import the checkpoint configs at every parse.

    Only clients that raise their own exception types through fsspec are named: botocore (s3fs
    lets ``EndpointConnectionError`` and other ``BotoCoreError`` through untranslated) and aiohttp
    (under every HTTP-based fsspec filesystem). Each is optional, like the filesystem that uses it.
    """
    errors: list[type[BaseException]] = [OSError]
    try:
        from botocore.exceptions import BotoCoreError, ClientError

        errors += [BotoCoreError, ClientError]
    except ImportError:  # pragma: no cover - botocore comes with s3fs, which is optional
        pass
    try:
        from aiohttp import ClientError as AiohttpClientError

        errors.append(AiohttpClientError)
    except ImportError:  # pragma: no cover - aiohttp comes with fsspec's async filesystems
        pass
    return tuple(errors)


#: Option names that carry a secret in some fsspec filesystem (s3fs, gcsfs, adlfs, sshfs, ...).
SECRET_OPTION_NAMES = frozenset(
    {
        "key",
        "secret",
        "token",
        "password",
        "passwd",
        "access_key",
        "secret_key",
        "secret_access_key",
        "session_token",
        "aws_access_key_id",
        "aws_secret_access_key",
        "aws_session_token",
        "account_key",
        "sas_token",
        "connection_string",
        "client_secret",
        "credentials",
        "private_key",
    }
)


class ConfigModel(BaseModel):
    """A sink's or a checkpoint's configuration: validated once where it is built, frozen, and
    registered as ``model_dump(mode="json")`` (read back by ``model_validate`` in a process that never
    imported the DAG). A refusal is an ``InvalidSinkConfig`` carrying the validator's own message."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", defer_build=True, serialize_by_alias=True, validate_by_name=True
    )

    #: The leading fields a DAG may give by position, in order (``FileSinkConfig("exports", "/data")``).
    positional: ClassVar[tuple[str, ...]] = ()
    #: What a refusal that no validator worded calls the input.
    what: ClassVar[str] = "configuration"

    def __init__(self, /, *args: Any, **values: Any) -> None:
        cls = type(self)
        if len(args) > len(cls.positional):
            raise TypeError(f"{cls.__name__} takes {len(cls.positional)} positional arguments, got {len(args)}")
        for name, value in zip(cls.positional, args, strict=False):
            if name in values:
                raise TypeError(f"{cls.__name__} got two values for {name!r}")
            values[name] = value
        try:
            super().__init__(**values)
        except ValidationError as exc:
            raise config_refusal(exc, f"{cls.what} {values!r}") from None

    # Marked as pydantic's own ``__init__`` (as its ``RootModel`` does), so ``model_validate`` validates
    # the fields directly, with its context, instead of calling this with them as keywords.
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]


def config_refusal(exc: ValidationError, what: str) -> InvalidSinkConfig:
    """The ``InvalidSinkConfig`` a validator raised, or one naming each fault (credentials masked)."""
    errors = exc.errors(include_url=False)
    for error in errors:
        if isinstance(cause := error.get("ctx", {}).get("error"), InvalidSinkConfig):
            return cause
    faults = "; ".join(
        f"{'.'.join(map(str, e['loc'])) or 'value'}: "
        + (f"unexpected keyword, not a field of {exc.title}" if e["type"] == "extra_forbidden" else e["msg"])
        for e in errors
    )
    return InvalidSinkConfig(mask_userinfo(f"{what}: {faults}"))


def refuse_secret_options(options: object, *, what: str) -> dict[str, Any]:
    """``storage_options`` travel with the config into the sink registry, XCom, the trigger's
    arguments, the UI and ``eo-sink``: a secret there would be shown in all of them. Refuse one by
    its name (at any depth, e.g. in ``client_kwargs``), never repeating its value."""
    if not isinstance(options, Mapping):
        raise InvalidSinkConfig(f"{what}: storage_options must be a mapping of fsspec options, got {options!r}")
    found = sorted(_secret_names(options, ""))
    if found:
        raise InvalidSinkConfig(
            f"{what}: storage_options holds credentials ({', '.join(found)}), which would be stored with "
            "the config and shown by the UI, eo-sink and the logs; put them in an Airflow connection of "
            "type 'aws' and name it in storage_conn_id"
        )
    return dict(options)


def _secret_names(options: Mapping[Any, Any], prefix: str) -> list[str]:
    found = []
    for name, value in options.items():
        dotted = f"{prefix}{name}"
        if str(name).lower() in SECRET_OPTION_NAMES:
            found.append(dotted)
        elif isinstance(value, Mapping):
            found.extend(_secret_names(value, dotted + "."))
    return found


def check_storage_conn_id(conn_id: object, *, what: str) -> None:
    if conn_id is not None and (not isinstance(conn_id, str) or not conn_id.strip()):
        raise InvalidSinkConfig(f"{what}: storage_conn_id must be a connection id or None, got {conn_id!r}")


def given_storage_options(
    options: Mapping[str, Any], conn_id: str | None, resolved: Mapping[str, Any] | None, *, what: str
) -> Mapping[str, Any]:
    """The options a source or committer opens its filesystem with: ``resolved`` (the config's
    options with its connection's credentials, from ``hooks.storage.resolved_storage_options``), else the config's own
    options when it names no connection. A config that names one is never opened without its
    credentials, which would otherwise read as an absent or unreadable store."""
    if resolved is not None:
        return resolved
    if conn_id is not None:
        raise InvalidSinkConfig(
            f"{what}: storage_conn_id {conn_id!r} is resolved in the task (hooks.storage.resolved_storage_options), "
            "not here; pass the resolved storage_options"
        )
    return options


def refuse_credentials(location: str, *, what: str) -> None:
    """A checkpoint location is registered with its sink and shown by the UI, eo-sink and the logs:
    credentials in it would be shown everywhere, so they belong in a connection."""
    if isinstance(location, str) and has_userinfo(location):
        raise InvalidSinkConfig(
            f"{what} {mask_userinfo(location)!r} holds credentials (user:password@, or a secret query parameter "
            "such as token= or sig=); keep them out of the location and out of storage_options: put them in an "
            "Airflow connection of type 'aws' and name it in storage_conn_id"
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
            fs, _ = url_to_fs(sample_url, storage_options, feature=f"{what} {sample_url!r}")
        except (ValueError, ImportError, TypeError) as exc:
            raise InvalidSinkConfig(mask_userinfo(f"{what} {sample_url!r}: cannot open its filesystem: {exc}")) from exc
        self.fs: Any = fs
        self._what = what

    def path(self, url: str) -> str:
        return str(self.fs._strip_protocol(url)).rstrip("/")

    @property
    def is_async(self) -> bool:
        """Whether the filesystem has a native async API we can await without a worker thread."""
        from fsspec.asyn import AsyncFileSystem  # fsspec's async machinery is for the triggerer, not the parse

        return bool(getattr(self.fs, "async_impl", False)) and isinstance(self.fs, AsyncFileSystem)

    def exists(self, path: str) -> bool:
        """Whether a *file* is there: on an object store any object below ``path`` makes it a
        "folder", and a folder named ``_SUCCESS`` (or ``commits/7``) is not the upstream's word."""
        self.fs.invalidate_cache(path)
        try:
            info = self.fs.info(path)
        except FileNotFoundError:
            return False
        except store_errors() as exc:
            raise self._unavailable(path, exc) from exc
        return _is_file(info)

    def listdir(self, path: str) -> list[str]:
        """Base names in a folder; a missing folder is empty."""
        self.fs.invalidate_cache(path)
        try:
            entries = self.fs.ls(path, detail=False)
        except FileNotFoundError:
            return []
        except store_errors() as exc:
            raise self._unavailable(path, exc) from exc
        return [str(entry).rstrip("/").rsplit("/", 1)[-1] for entry in entries]

    async def aexists(self, path: str) -> bool:
        self.fs.invalidate_cache(path)
        try:
            info = await self._on_fs_loop(self.fs._info(path))
        except FileNotFoundError:
            return False
        except store_errors() as exc:
            raise self._unavailable(path, exc) from exc
        return _is_file(info)

    async def alistdir(self, path: str) -> list[str]:
        self.fs.invalidate_cache(path)
        try:
            entries = await self._on_fs_loop(self.fs._ls(path, detail=False))
        except FileNotFoundError:
            return []
        except store_errors() as exc:
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


def _is_file(info: Any) -> bool:
    return not isinstance(info, Mapping) or info.get("type") != "directory"
