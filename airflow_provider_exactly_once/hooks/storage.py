"""Object-store credentials from an Airflow connection, read where the files are touched.

A file sink's or checkpoint's config is serialised into the registry, XCom, the UI and ``eo-sink``
output, so it only names its ``aws`` connection (``storage_conn_id``); ``resolved_storage_options``
turns it into s3fs options in the process that opens the filesystem, never while a DAG is parsed.
The contract: design.md D13; the connection's fields, read as the Amazon provider reads them:
docs/configuration.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from airflow.sdk import BaseHook

from airflow_provider_exactly_once.core.errors import InvalidSinkConfig
from airflow_provider_exactly_once.version_compat import AirflowNotFoundException

__all__ = [
    "STORAGE_CONN_TYPE",
    "NamesStorage",
    "ObjectStorageHook",
    "aresolved_storage_options",
    "resolved_storage_options",
    "storage_options_from_connection",
]

STORAGE_CONN_TYPE = "aws"
#: Extra keys that ask for an authentication this hook does not perform; ignoring them would
#: silently use other credentials than the connection's owner meant.
_UNSUPPORTED = ("role_arn", "assume_role_method", "assume_role_kwargs")


class NamesStorage(Protocol):
    """A file sink's or checkpoint's config: non-secret options, and the connection holding the rest."""

    @property
    def storage_options(self) -> Mapping[str, Any]: ...

    @property
    def storage_conn_id(self) -> str | None: ...


def resolved_storage_options(config: NamesStorage) -> dict[str, Any]:
    """The config's options with the credentials of its ``storage_conn_id``, read now."""
    if config.storage_conn_id is None:
        return dict(config.storage_options)
    return ObjectStorageHook(config.storage_conn_id).storage_options(config.storage_options)


async def aresolved_storage_options(config: NamesStorage) -> dict[str, Any]:
    """``resolved_storage_options`` for the triggerer's event loop (a synchronous fetch of the
    connection may not run on it)."""
    if config.storage_conn_id is None:
        return dict(config.storage_options)
    return await ObjectStorageHook(config.storage_conn_id).astorage_options(config.storage_options)


class ObjectStorageHook(BaseHook):
    """Resolves ``storage_conn_id`` to the fsspec options of an S3-compatible store.

    :param storage_conn_id: an Airflow connection of type ``aws``.
    """

    conn_name_attr = "storage_conn_id"
    conn_type = STORAGE_CONN_TYPE
    hook_name = "Exactly-once object storage"

    def __init__(self, storage_conn_id: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.storage_conn_id = storage_conn_id

    def storage_options(self, base: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The connection's options merged into ``base`` (a config's non-secret ``storage_options``)."""
        try:
            conn = self.get_connection(self.storage_conn_id)
        except AirflowNotFoundException:
            raise self._missing() from None
        return _merge(base or {}, storage_options_from_connection(self.storage_conn_id, conn), self.storage_conn_id)

    async def astorage_options(self, base: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """``storage_options`` for the triggerer's event loop, where connections are fetched asynchronously."""
        try:
            conn = await self.aget_connection(self.storage_conn_id)
        except AirflowNotFoundException:
            raise self._missing() from None
        return _merge(base or {}, storage_options_from_connection(self.storage_conn_id, conn), self.storage_conn_id)

    def _missing(self) -> InvalidSinkConfig:
        return InvalidSinkConfig(
            f"storage connection {self.storage_conn_id!r} does not exist; create it (type {STORAGE_CONN_TYPE!r}: "
            "login = access key id, password = secret access key, extra endpoint_url and region_name)"
        )


def storage_options_from_connection(conn_id: str, conn: Any) -> dict[str, Any]:
    """s3fs options of an ``aws`` connection (the attributes of ``airflow.sdk.Connection``)."""
    if conn.conn_type != STORAGE_CONN_TYPE:
        raise InvalidSinkConfig(
            f"storage connection {conn_id!r} has type {conn.conn_type!r}; storage_conn_id takes a connection of "
            f"type {STORAGE_CONN_TYPE!r}"
        )
    extra = conn.extra_dejson or {}
    unsupported = [name for name in _UNSUPPORTED if extra.get(name)]
    if unsupported:
        raise InvalidSinkConfig(
            f"storage connection {conn_id!r}: extra {unsupported} is not supported for file sinks and checkpoint "
            "markers; give the access key id and secret, or leave them out to use the environment's credentials"
        )
    options: dict[str, Any] = {}
    key = conn.login or extra.get("aws_access_key_id")
    secret = conn.password or extra.get("aws_secret_access_key")
    if bool(key) != bool(secret):
        raise InvalidSinkConfig(
            f"storage connection {conn_id!r} has {'an access key id' if key else 'a secret'} without "
            f"{'its secret' if key else 'an access key id'}"
        )
    if key:
        options["key"], options["secret"] = str(key), str(secret)
    if extra.get("aws_session_token"):
        options["token"] = str(extra["aws_session_token"])
    if extra.get("profile_name"):
        options["profile"] = str(extra["profile_name"])
    client: dict[str, Any] = {}
    service = extra.get("service_config") or {}
    s3_service = service.get("s3") if isinstance(service, Mapping) else None
    endpoint = (s3_service or {}).get("endpoint_url") if isinstance(s3_service, Mapping) else None
    endpoint = endpoint or extra.get("endpoint_url")
    if endpoint:
        client["endpoint_url"] = str(endpoint)
    if extra.get("region_name"):
        client["region_name"] = str(extra["region_name"])
    if "verify" in extra:
        client["verify"] = extra["verify"]
    if client:
        options["client_kwargs"] = client
    config = extra.get("config_kwargs")
    if config is not None:
        if not isinstance(config, Mapping):
            raise InvalidSinkConfig(f"storage connection {conn_id!r}: extra config_kwargs is not an object")
        options["config_kwargs"] = dict(config)
    return options


def _merge(base: Mapping[str, Any], resolved: Mapping[str, Any], conn_id: str) -> dict[str, Any]:
    """The config's options with the connection's added; a setting made in both places, differently,
    is refused rather than silently decided (which one wins would depend on where one looks)."""
    merged = dict(base)
    for name, value in resolved.items():
        mine = merged.get(name)
        if isinstance(mine, Mapping) and isinstance(value, Mapping):
            for inner, inner_value in value.items():
                if inner in mine and mine[inner] != inner_value:
                    raise InvalidSinkConfig(
                        f"storage_options sets {name}.{inner} and storage connection {conn_id!r} sets it "
                        "differently; keep it in one place"
                    )
            merged[name] = {**mine, **value}
        elif name in merged and mine != value:
            raise InvalidSinkConfig(
                f"storage_options sets {name} and storage connection {conn_id!r} sets it differently; keep it in "
                "one place"
            )
        else:
            merged[name] = value
    return merged
