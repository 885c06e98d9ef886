"""The fault harness on the production-like stack (``--stack production``, docs/faults.md): the
scenarios only that stack can run, and the Spark write killed with its executors on a standalone
worker, on a cluster of their own.

Airflow on the CeleryExecutor with two workers (broker: the Redis at 127.0.0.1:6379, under a key
prefix of the cluster's), the tables behind SeaweedFS's Iceberg REST catalog with their files on its
S3, Spark a standalone master and worker. A Celery worker is killed while it holds a commit past
the catalog update, SeaweedFS is killed and restarted while commits run, a proxy in front of the
catalog loses the response to a fan-out's one ``transactions/commit`` of its two tables, a fan-out's
commits are killed before, inside and after that request, and the task of a Spark write is killed while the master runs its
executors; each table is then judged from its input alone (an executor's late file would be an
orphan). The other named scenarios the local stack runs too are left to ``test_fault_harness.py``
(the production stack runs them with ``scripts/faults --stack production``): CI time. Without ``weed`` or Redis the test is skipped with the reason, except under CI (``CI=true``),
where that is a failure.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from fault_harness.cluster import Cluster
from fault_harness.runner import run_scenarios
from fault_harness.scenarios import scenarios_for
from fault_harness.stacks import StackUnavailable
from tests.fault_harness.reports import failures

pytestmark = pytest.mark.postgres

PRODUCTION_ONLY = ["kill_celery_worker_during_commit", "catalog_restart", "drop_commit_response"]
#: Runs on both stacks, but only this one has executors outside the task's process tree.
DISTRIBUTED_SPARK = ["kill_spark_write"]
#: Runs on both stacks, but only this one commits a fan-out's tables in one transactions/commit.
TRANSACTION_PATH = ["fan_out_kill_commit"]


@pytest.fixture(scope="module")
def production_cluster(pg_url: str) -> Iterator[Cluster]:  # pg_url: skips (fails under CI) without PostgreSQL
    try:
        c = Cluster.create(parallelism=3, stack="production")
    except StackUnavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI needs the production stack: {exc}")
        pytest.skip(str(exc))
    try:
        c.start_all()
        yield c
    finally:
        c.close(keep_root=bool(os.environ.get("EO_FAULTS_KEEP")))


# A few minutes under a real scheduler and Celery; the project's 600 s default per test is too short
# on a loaded machine.
@pytest.mark.timeout(1800)
def test_the_production_scenarios_end_with_no_anomaly(production_cluster: Cluster) -> None:
    scenarios, skipped = scenarios_for("production", PRODUCTION_ONLY + DISTRIBUTED_SPARK + TRANSACTION_PATH)
    assert not skipped
    report = run_scenarios(production_cluster, scenarios, timeout=1200)
    assert report["recovery_run"] == "success", failures(report)
    assert report["anomalies"] == 0 and report["action_errors"] == 0, failures(report)
    results = report["scenarios"]
    # The faults did happen: the worker holding the commit was killed, the catalog went down and came
    # back, and a commit's response was lost after the catalog applied it.
    assert any("kill -9 of celery-worker-" in line for line in results["kill_celery_worker_during_commit"]["actions"])
    assert any("seaweedfs restarted" in line for line in results["catalog_restart"]["actions"])
    # drop_commit_response is a fan-out: what the proxy lost was the answer to both tables' one request.
    dropped = [line for line in results["drop_commit_response"]["actions"] if "dropped by the proxy" in line]
    assert dropped and "/transactions/commit" in dropped[0], results["drop_commit_response"]["actions"]
    spark_actions = results["kill_spark_write"]["actions"]
    assert any("Spark standalone master spark://" in line for line in spark_actions), spark_actions
    assert any("kill -9 of the task process of transform" in line for line in spark_actions), spark_actions
    for name, result in results.items():
        completed = result["hours"].get("completed", 0)
        assert (result["marked_snapshots"], result["rows_visible"]) == (completed, 12 * completed), name
    for name in ("drop_commit_response", "fan_out_kill_commit"):  # each table judged, and against the other
        assert results[name]["tables"] == [f"faults.{name}", f"faults.{name}_2"], results[name]
        assert results[name]["hours"] == {"completed": results[name]["marked_snapshots"]}, results[name]
