"""Loading tables, with the catalog's and the driver's errors translated into the domain's.

The coordinator decides retry-or-refuse from the error class alone (``core.errors``), so a missing
table must come out as ``UnknownTable`` (retrying cannot help) and a dropped connection as
``SinkUnavailable`` (retrying can), whichever catalog implementation raised them.

The catalog's properties hold the storage credentials of the Iceberg connection (``s3.secret-access-key``,
the REST ``credential``, ``glue.secret-access-key``...); a driver's error text can quote a URL or a
setting, and these messages reach task logs, the meta store's ``error`` column and the UI, so every
one passes through ``describe_error`` first.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import sqlalchemy.exc
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError, ServerError, ServiceUnavailableError
from pyiceberg.table import Table

from airflow_provider_exactly_once.core.errors import SinkUnavailable, UnknownTable
from airflow_provider_exactly_once.core.redact import MASK, SECRET_PROPERTY_MARKS, mask_userinfo

#: Errors meaning "the catalog or storage could not be reached", not "the request was wrong".
UNREACHABLE: tuple[type[BaseException], ...] = (
    sqlalchemy.exc.OperationalError,
    sqlalchemy.exc.InterfaceError,
    sqlalchemy.exc.DisconnectionError,
    sqlalchemy.exc.TimeoutError,
    ServiceUnavailableError,
    ServerError,
    ConnectionError,
    TimeoutError,
    OSError,
)


def secret_values(properties: Mapping[str, Any]) -> list[str]:
    """The values of the secret-looking properties, longest first (so no secret is masked in part)."""
    values = {
        value
        for key, value in properties.items()
        if isinstance(value, str) and any(part in key.lower() for part in SECRET_PROPERTY_MARKS)
    }
    # A REST ``credential`` is ``client_id:client_secret``: its secret half can appear on its own.
    for key, value in properties.items():
        if key == "credential" and isinstance(value, str) and ":" in value:
            values.add(value.split(":", 1)[1])
    return sorted((v for v in values if len(v) >= 4), key=len, reverse=True)


def describe_error(exc: BaseException, properties: Mapping[str, Any]) -> str:
    """``<type>: <message>`` with userinfo and the given properties' secret values masked."""
    text = mask_userinfo(f"{type(exc).__name__}: {exc}")
    for value in secret_values(properties):
        text = text.replace(value, MASK)
    return text


@contextmanager
def unavailable_when_unreachable(what: str, properties: Mapping[str, Any]) -> Iterator[None]:
    """``SinkUnavailable`` (retryable, secrets masked) for an unreachable catalog or storage.

    Reading a table's manifests, checking or deleting its files reaches object storage through the
    table's FileIO, whose errors are the driver's own (pyarrow's ``OSError``, botocore's, requests');
    a raw one would reach the coordinator as an unknown failure instead of "try again".
    """
    try:
        yield
    except UNREACHABLE as exc:
        raise SinkUnavailable(f"{what}: {describe_error(exc, properties)}") from exc


def load_table(catalog: Catalog, name: str) -> Table:
    try:
        return catalog.load_table(name)
    except (NoSuchTableError, NoSuchNamespaceError) as exc:
        raise UnknownTable(f"catalog {catalog.name!r} has no table {name!r}: {exc}") from exc
    except UNREACHABLE as exc:
        raise SinkUnavailable(
            f"catalog {catalog.name!r} could not load table {name!r}: {describe_error(exc, catalog.properties)}"
        ) from exc
