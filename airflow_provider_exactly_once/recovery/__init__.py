"""Recovery: finish every epoch a crash left half done, and remove orphaned write locations.

``recover_sink`` is one sink's recovery; ``recovery_dag`` maps it over the meta store's sink registry;
the ``plugins`` listener triggers a run when the scheduler starts. The names are resolved on first
use (PEP 562): the recovery DAG's file imports this package at every parse, and only its tasks need
the coordinator and the committers behind ``recover_sink``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_provider_exactly_once.core.errors import SinkLocked
from airflow_provider_exactly_once.defaults import DEFAULT_LOCK_TTL, DEFAULT_ORPHAN_GRACE
from airflow_provider_exactly_once.extras import lazy_exports

if TYPE_CHECKING:
    from airflow_provider_exactly_once.recovery.sink import SinkRecoveryReport, recover_sink

__all__ = ["DEFAULT_LOCK_TTL", "DEFAULT_ORPHAN_GRACE", "SinkLocked", "SinkRecoveryReport", "recover_sink"]

__getattr__, __dir__ = lazy_exports(
    __name__, {name: "sink" for name in ("SinkRecoveryReport", "recover_sink")}, globals()
)
