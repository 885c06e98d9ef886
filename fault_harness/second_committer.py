"""A second live attempt at one epoch's commit, outside Airflow: the zombie of the ``zombie`` scenario.

``python -m fault_harness.second_committer <json args>`` builds a coordinator from the same meta store,
catalog and checkpoint markers the DAG's tasks use and commits the epoch, while the DAG's own commit
task is paused (a ``pause`` rule of the fault plan) after loading the table. Prints the outcome.
"""

from __future__ import annotations

import json
import sys

from pyiceberg.catalog import load_catalog

from airflow_provider_exactly_once.checkpoints.config import MarkerFileCheckpoint
from airflow_provider_exactly_once.core.coordinator import TwoPhaseCommitCoordinator
from airflow_provider_exactly_once.sinks.iceberg import IcebergSinkCommitter
from airflow_provider_exactly_once.store import SqlSinkStateStore


def main(argv: list[str]) -> int:
    args = json.loads(argv[0])
    catalog = load_catalog(args["catalog_name"], **args["catalog"])
    store = SqlSinkStateStore(args["meta_url"])
    try:
        coordinator = TwoPhaseCommitCoordinator(
            store,
            {args["sink_id"]: IcebergSinkCommitter(catalog)},
            MarkerFileCheckpoint(args["checkpoint_template"]).source(),
        )
        result = coordinator.commit(args["sink_id"], int(args["epoch"]))
        print(json.dumps({"outcome": result.outcome.value, "write_id": result.record.write_id}))
    finally:
        store.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
