"""What the package imports only when it is used: the distribution's optional extras, each brought in
through ``require`` where its feature is used and refused there naming the extra to install, never
at DAG parse time; and the names a package exports but imports on first access (PEP 562), for the
packages every DAG file, Spark driver, ``eo-sink`` command or provider discovery imports.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module
from types import ModuleType
from typing import Any

# The optional extras of the distribution and the one error for a missing one.
#
# The base install serves the scheduler, the API server, the dag-processor and the workers that
# persist, wait, commit, abort and recover; pyspark, PostgreSQL's driver, s3fs, Glue and OpenLineage
# are extras. A missing one must fail where the feature is used, naming the extra to install, never
# at DAG parse time: so the modules that need them import them through ``require``, lazily.

__all__ = ["EXTRAS", "MissingExtra", "lazy_exports", "require", "url_to_fs"]

DISTRIBUTION = "airflow-provider-exactly-once"

#: Each extra, and what it brings (the keys are ``pyproject.toml``'s ``optional-dependencies``).
EXTRAS = {
    "spark": "PySpark, for the epoch's write (the application spark-submit runs)",
    "postgres": "PostgreSQL's driver, for a meta store, SQL catalog or checkpoint table on PostgreSQL",
    "s3": "s3fs, for s3:// paths (landed input, markers, file sinks, write locations)",
    "glue": "pyiceberg's Glue catalog",
    "openlineage": "the OpenLineage provider, for lineage events of the write and commit tasks",
    "audit": "DuckDB, for the built-in SQL checks of an audited sink",
}


class MissingExtra(ImportError):
    """A feature was used whose extra is not installed. An ``ImportError``, so code that already
    degrades on a missing import (an optional integration) keeps doing so."""

    def __init__(self, extra: str, feature: str, missing: str) -> None:
        self.extra = extra
        super().__init__(
            f"{feature} needs the [{extra}] extra ({missing} is not installed): pip install '{DISTRIBUTION}[{extra}]'",
            name=missing,
        )


def require(module: str, *, extra: str, feature: str) -> ModuleType:
    """``import_module(module)``, or ``MissingExtra`` naming ``extra`` when it is not installed."""
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}: one of {sorted(EXTRAS)}")
    try:
        return import_module(module)
    except ModuleNotFoundError as exc:
        top = module.split(".")[0]
        if exc.name is None or exc.name.split(".")[0] != top:
            raise  # the module is there and something it imports is not: not this extra's doing
        raise MissingExtra(extra, feature, top) from exc


#: fsspec protocols whose filesystem comes with an extra, and the module that brings it.
PROTOCOL_EXTRAS = {"s3": ("s3", "s3fs"), "s3a": ("s3", "s3fs"), "s3n": ("s3", "s3fs")}


def url_to_fs(url: str, options: Mapping[str, Any] | None, *, feature: str) -> tuple[Any, str]:
    """``fsspec.core.url_to_fs``, with a missing filesystem package reported as its extra."""
    import fsspec.core

    try:
        return fsspec.core.url_to_fs(url, **dict(options or {}))  # type: ignore[no-any-return]
    except ImportError as exc:
        known = PROTOCOL_EXTRAS.get(fsspec.core.split_protocol(url)[0] or "")
        if known is None:
            raise
        raise MissingExtra(known[0], feature, known[1]) from exc


# Names a package exports but imports only when first used (PEP 562).
#
# The package root, ``operators``, ``checkpoints``, ``hooks`` and ``recovery`` are imported by every DAG file, the
# Spark driver, the ``eo-sink`` command or provider discovery, and each of those needs few of their
# names: each name's module is imported on first access, then kept as a plain attribute.


def lazy_exports(
    package: str, where: Mapping[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``, whose name ``n`` lives in the submodule
    ``where[n]``; ``namespace`` is the package's ``globals()``."""

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(f"{package}.{module}"), name)
        namespace[name] = value  # the next access is a plain module attribute
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *where})

    return __getattr__, __dir__
