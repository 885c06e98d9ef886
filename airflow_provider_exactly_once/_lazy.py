"""Names a package exports but imports only when first used (PEP 562).

The package root, ``operators``, ``checkpoints``, ``hooks`` and ``recovery`` are imported by every DAG file, the
Spark driver, the ``eo-sink`` command or provider discovery, and each of those needs few of their
names: each name's module is imported on first access, then kept as a plain attribute.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any


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
