"""A coordinator in its own process, for the process-level race tests (spawned, so nothing is shared)."""

from __future__ import annotations

import time
import traceback
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_provider_exactly_once.core.coordinator import TwoPhaseCommitCoordinator
    from airflow_provider_exactly_once.core.precommit import PreCommit
    from tests.support.pipeline import Pipeline


def race_config(pipeline: Pipeline, sink_id: str) -> dict[str, Any]:
    """What a spawned racer needs to reach the same databases and warehouse (picklable)."""
    return {
        "meta_url": pipeline.meta_url,
        "catalog_url": pipeline.catalog_url,
        "warehouse": str(pipeline.warehouse),
        "catalog_name": pipeline.catalog_name,
        "namespace": pipeline.namespace,
        "sink_id": sink_id,
    }


def _pipeline(config: dict[str, Any]) -> Pipeline:
    from tests.support.pipeline import Pipeline

    return Pipeline(
        meta_url=config["meta_url"],
        catalog_url=config["catalog_url"],
        warehouse=Path(config["warehouse"]),
        catalog_name=config["catalog_name"],
        namespace=config["namespace"],
    )


def race_commits(config: dict[str, Any], epochs: Queue[int | None], results: Queue[str], barrier: Barrier) -> None:
    pipeline = _pipeline(config)
    coordinator = pipeline.coordinator(config["sink_id"], pipeline.iceberg_committer())
    try:
        while (epoch := epochs.get()) is not None:
            barrier.wait(timeout=60)
            try:
                results.put(str(coordinator.commit(config["sink_id"], epoch).outcome))
            except Exception as exc:
                results.put(f"error: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
    finally:
        pipeline.dispose()


def race_generations(config: dict[str, Any], writes: Queue[str | None], results: Queue[str], barrier: Barrier) -> None:
    """Persist and commit each write given (a pre-commit's JSON), retrying as the tasks would.

    Paired with another process given another generation's write of the same epoch: the commit
    tasks' retries are what let the newer generation win after a ``RevisionInProgress``.
    """
    from airflow_provider_exactly_once.core.precommit import PreCommit

    pipeline = _pipeline(config)
    sink_id = config["sink_id"]
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer(), on_reprocess={sink_id: "replace"})
    try:
        while (payload := writes.get()) is not None:
            write = PreCommit.from_json(payload)
            barrier.wait(timeout=60)
            try:
                results.put(persist_and_commit(coordinator, write))
            except Exception as exc:
                results.put(f"error: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
    finally:
        pipeline.dispose()


def persist_and_commit(coordinator: TwoPhaseCommitCoordinator, write: PreCommit) -> str:
    """What a run's persist and commit tasks do, retries and their delay included: the name of the
    last persist outcome, or ``"gave up"`` when every retry met a revision under way or a lost race."""
    from airflow_provider_exactly_once.core.errors import RevisionInProgress, StateConflict

    for attempt in range(40):
        try:
            persisted = coordinator.persist(write)
            if persisted.write_id == write.write_id:
                coordinator.commit(write.sink_id, write.epoch)
            return persisted.outcome.name
        except (RevisionInProgress, StateConflict):
            time.sleep(min(0.02 * (attempt + 1), 0.5))
    return "gave up"
