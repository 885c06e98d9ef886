"""The fault harness's fixed-seed random run under the real Airflow scheduler (the CI version of
``scripts/faults --random``; docs/faults.md), on a local-stack cluster of its own: a file apart from
the named scenarios' so that the two runs are not one worker's sum. Nothing is mocked."""

from __future__ import annotations

import pytest

from fault_harness.cluster import Cluster
from fault_harness.plans import describe_plan
from fault_harness.runner import run_scenarios
from fault_harness.scenarios import random_plan
from tests.fault_harness.reports import failures

pytestmark = pytest.mark.postgres

#: The CI's random run; the long run is ``scripts/faults --random --epochs 200`` (docs/faults.md).
#: This seed's plan has two pipelines: an append pipeline of 6 hours that also reprocesses (a clear
#: of a committed hour, landed anew, its revision crashed before the catalog update) and an upsert
#: pipeline of 3 hours (a failed hour, a compaction between an epoch's write and its commit); the
#: scheduler is killed once. Drawn without audited pipelines (``audits=False``, the plan as it was):
#: CI's audited pipeline is ``audit_kill_points`` in ``test_fault_harness.py``, and this seed's would draw its
#: append pipeline audited, which reprocesses nothing.
CI_SEED = 20261163
CI_RANDOM_EPOCHS = 9
CI_PER_PIPELINE = 6


# Minutes under a real scheduler; the project's 600 s default per test would cut them off.
@pytest.mark.timeout(1800)
def test_a_fixed_seed_random_run_ends_with_no_anomaly(fault_cluster: Cluster) -> None:
    scenarios = random_plan(CI_SEED, CI_RANDOM_EPOCHS, per_pipeline=CI_PER_PIPELINE, audits=False)
    assert describe_plan(scenarios) == describe_plan(
        random_plan(CI_SEED, CI_RANDOM_EPOCHS, per_pipeline=6, audits=False)
    )
    assert [s.mode for s in scenarios] == ["append", "upsert"]
    report = run_scenarios(fault_cluster, scenarios, timeout=1200)
    assert report["faulted_epochs"] == CI_RANDOM_EPOCHS
    assert report["reprocessed_epochs"] >= 1, report["scenarios"]
    assert report["anomalies"] == 0 and report["action_errors"] == 0, f"seed {CI_SEED}: {failures(report)}"
