"""Two coordinators committing the same epoch at the same moment: exactly one snapshot, every time.

Threads share a process (and pyiceberg's and SQLAlchemy's module state); processes share nothing but
the databases and the warehouse, like two Airflow workers running a task and its zombie.
"""

from __future__ import annotations

import multiprocessing
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from airflow_provider_exactly_once.core.epochs import CheckpointStatus, EpochStatus
from airflow_provider_exactly_once.core.outcomes import CommitOutcome
from tests.support.pipeline import Pipeline
from tests.support.racer import race_commits, race_config

REPETITIONS = 50
#: The thread race runs on a named branch (its first epoch also creates the branch), the process race
#: on ``main``: one branch case per 50-epoch loop keeps the suite's time, and each path is raced.
THREAD_BRANCH = "audit"


def _twin(pipeline: Pipeline) -> Pipeline:
    return Pipeline(
        meta_url=pipeline.meta_url,
        catalog_url=pipeline.catalog_url,
        warehouse=pipeline.warehouse,
        catalog_name=pipeline.catalog_name,
        namespace=pipeline.namespace,
    )


def _prepare(pipeline: Pipeline, sink_id: str, epoch: int, branch: str = "main") -> None:
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer(branch=branch))
    coordinator.persist(pipeline.write_iceberg(sink_id, epoch, ["orders"], rows=2))
    pipeline.checkpoint(sink_id, epoch, CheckpointStatus.COMPLETED)


def _assert_once_each(pipeline: Pipeline, sink_id: str, outcomes: list[list[str]], branch: str = "main") -> None:
    snapshots = pipeline.marker_snapshots("orders", sink_id)
    assert {epoch: len(writes) for epoch, writes in snapshots.items()} == dict.fromkeys(range(REPETITIONS), 1)
    for epoch, pair in enumerate(outcomes):
        assert Counter(pair) == {str(CommitOutcome.COMMITTED): 1, str(CommitOutcome.ALREADY_COMMITTED): 1}, (
            epoch,
            pair,
        )
        assert pipeline.store.get(sink_id, epoch).status is EpochStatus.COMMITTED  # type: ignore[union-attr]
    assert len(pipeline.rows("orders", branch=branch)) == 2 * REPETITIONS


def test_two_threads_commit_the_same_epoch(pipeline: Pipeline, sink_id: str) -> None:
    pipeline.create_table("orders")
    twins = [_twin(pipeline), _twin(pipeline)]
    coordinators = [t.coordinator(sink_id, t.iceberg_committer(branch=THREAD_BRANCH)) for t in twins]
    outcomes = []
    with ThreadPoolExecutor(2) as pool:
        for epoch in range(REPETITIONS):
            _prepare(pipeline, sink_id, epoch, THREAD_BRANCH)
            barrier = threading.Barrier(2)

            def commit(index: int, epoch: int = epoch, barrier: threading.Barrier = barrier) -> str:
                barrier.wait(timeout=30)
                return str(coordinators[index].commit(sink_id, epoch).outcome)

            outcomes.append(list(pool.map(commit, [0, 1])))
    for twin in twins:
        twin.dispose()
    _assert_once_each(pipeline, sink_id, outcomes, THREAD_BRANCH)


def test_two_processes_commit_the_same_epoch(pipeline: Pipeline, sink_id: str) -> None:
    pipeline.create_table("orders")
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(2)
    results: multiprocessing.Queue[str] = context.Queue()
    queues: list[multiprocessing.Queue[int | None]] = [context.Queue(), context.Queue()]
    config = race_config(pipeline, sink_id)
    workers = [context.Process(target=race_commits, args=(config, q, results, barrier)) for q in queues]
    for worker in workers:
        worker.start()
    outcomes = []
    try:
        for epoch in range(REPETITIONS):
            _prepare(pipeline, sink_id, epoch)
            for queue in queues:
                queue.put(epoch)
            outcomes.append([results.get(timeout=120), results.get(timeout=120)])
    finally:
        for queue in queues:
            queue.put(None)
        for worker in workers:
            worker.join(timeout=60)
    errors = [o for pair in outcomes for o in pair if o.startswith("error")]
    assert not errors, errors[0]
    _assert_once_each(pipeline, sink_id, outcomes)
