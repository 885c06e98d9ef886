"""Recovery: finish every epoch a crash left half done, and remove orphaned write locations.

``recover_sink`` is one sink's recovery; ``recovery_dag`` maps it over the meta store's sink registry;
the ``plugins`` listener triggers a run when the scheduler starts.
"""

from airflow_provider_exactly_once.defaults import DEFAULT_ORPHAN_GRACE
from airflow_provider_exactly_once.recovery.sink import (
    DEFAULT_LOCK_TTL,
    SinkLocked,
    SinkRecoveryReport,
    recover_sink,
)

__all__ = ["DEFAULT_LOCK_TTL", "DEFAULT_ORPHAN_GRACE", "SinkLocked", "SinkRecoveryReport", "recover_sink"]
