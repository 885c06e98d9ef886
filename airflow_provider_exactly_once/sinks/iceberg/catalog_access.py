"""Loading tables, with the catalog's and the driver's errors translated into the domain's.

The coordinator decides retry-or-refuse from the error class alone (``core.errors``), so a missing
table must come out as ``UnknownTable`` (retrying cannot help) and a dropped connection as
``SinkUnavailable`` (retrying can), whichever catalog implementation raised them.
"""

from __future__ import annotations

import sqlalchemy.exc
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError, ServerError, ServiceUnavailableError
from pyiceberg.table import Table

from airflow_provider_exactly_once.core.errors import SinkUnavailable, UnknownTable

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


def load_table(catalog: Catalog, name: str) -> Table:
    try:
        return catalog.load_table(name)
    except (NoSuchTableError, NoSuchNamespaceError) as exc:
        raise UnknownTable(f"catalog {catalog.name!r} has no table {name!r}: {exc}") from exc
    except UNREACHABLE as exc:
        raise SinkUnavailable(
            f"catalog {catalog.name!r} could not load table {name!r}: {type(exc).__name__}: {exc}"
        ) from exc
