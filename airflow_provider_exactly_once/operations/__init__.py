"""The sink-operations service: what the ``eo-sink`` tool and the Airflow UI's sink view show and do.

Reads are in ``reads.SinkReads``; every action goes through the sink's coordinator (rebuilt from the
sink registry), so it runs under the same invariants as the DAG's own tasks; see ``service.SinkOperations``.
The runs that will never finish are found by ``stale_runs``, from Airflow's database.
"""

from airflow_provider_exactly_once.operations.reads import InvalidRequest, SinkNotFound, SinkReads
from airflow_provider_exactly_once.operations.service import SinkOperations
from airflow_provider_exactly_once.operations.views import (
    ActionResult,
    CheckpointView,
    EpochView,
    SinkSummary,
    TableView,
)

__all__ = [
    "ActionResult",
    "CheckpointView",
    "EpochView",
    "InvalidRequest",
    "SinkNotFound",
    "SinkOperations",
    "SinkReads",
    "SinkSummary",
    "TableView",
]
