"""The fault harness's audited pipeline under the real Airflow scheduler (write, audit, publish,
design.md D23; docs/faults.md): ``audit_kill_points``, each epoch killed -9 at another step the
audit adds, one hour failing its audit, on a local-stack cluster of its own (a file apart, so that
it runs beside the named scenarios' and the random run's on another test worker). Nothing is mocked."""

from __future__ import annotations

import pytest

from fault_harness.cluster import Cluster
from fault_harness.runner import run_scenarios
from fault_harness.scenarios import AUDIT_POINTS, scenarios_for
from tests.fault_harness.reports import failures

pytestmark = pytest.mark.postgres


# 26 minutes under a real scheduler on the loaded 2-core machine (load average 40); the
# project's 600 s default per test would cut them off.
@pytest.mark.timeout(2400)
def test_kills_at_every_audit_step_publish_each_passed_epoch_once_and_no_failed_one(fault_cluster: Cluster) -> None:
    scenarios, skipped = scenarios_for("local", ["audit_kill_points"])
    assert not skipped
    report = run_scenarios(fault_cluster, scenarios, timeout=1200)
    assert report["anomalies"] == 0 and report["action_errors"] == 0, failures(report)
    result = report["scenarios"]["audit_kill_points"]
    epochs = len(AUDIT_POINTS) + 1
    assert any(f"kills fired in {epochs} of {epochs} epochs" in line for line in result["actions"]), result["actions"]
    # Every passed epoch published once (one marker on main each), the bad one held on its audit
    # branch, its audit snapshot the only one left; the bad hour's run failed, the others succeeded.
    assert result["marked_snapshots"] == len(AUDIT_POINTS), result
    assert result["hours"] == {"completed": len(AUDIT_POINTS), "audit_failed": 1}, result
    assert result["audit"]["published"] == len(AUDIT_POINTS) and result["audit"]["held"] == 1, result["audit"]
    assert result["audit"]["audit_snapshots"] == 1, result["audit"]
    assert sorted(result["runs"].values()) == ["failed"] + ["success"] * len(AUDIT_POINTS), result["runs"]
