"""``eo-sink`` on an audited sink (design.md D23): ``show``, ``epochs`` and ``status`` say where each
epoch's audit stands, and ``reject`` drops only a write whose audit failed. The epochs are audited
by a real coordinator on a real SQLite catalog, and the sink is registered audited, as the epoch
operators register it, so the commands rebuild its coordinator as recovery does."""

from __future__ import annotations

import io
import json

from airflow_provider_exactly_once.cli.main import EXIT_FAILED, EXIT_OK, main
from airflow_provider_exactly_once.core.coordinator import TwoPhaseCommitCoordinator
from airflow_provider_exactly_once.core.epochs import AbortCause, AuditCheck, CheckpointStatus, EpochStatus
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.sinks.iceberg.markers import audit_branch_name
from tests.operations.helpers import register, write
from tests.recovery.helpers import E0, E1, E2, E3, exists
from tests.support.airflow_world import World
from tests.support.independent_reader import read_branch

FAILED_CHECKS = [
    AuditCheck(name="row_count", passed=True),
    AuditCheck(name="no_null_ids", passed=False, message="3 rows break the check"),
]


def run_main(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(args), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def _audited(world: World) -> TwoPhaseCommitCoordinator:
    register(world, world.iceberg_sink().model_copy(update={"audited": True}))
    return world.pipeline.coordinator(world.sink_id, world.pipeline.iceberg_committer(), audited=[world.sink_id])


def _audit(world: World, coordinator: TwoPhaseCommitCoordinator, epoch: int) -> PreCommit:
    pre = write(world, epoch)
    coordinator.persist(pre, dag_id="audited", run_id=f"scheduled__{epoch}")
    world.mark(epoch, CheckpointStatus.COMPLETED)
    coordinator.commit_audit(world.sink_id, epoch)
    return pre


def _stages(world: World) -> tuple[TwoPhaseCommitCoordinator, dict[int, PreCommit]]:
    """E0 published, E1 Auditing, E2 Audit failed, E3 Audited."""
    coordinator = _audited(world)
    writes = {epoch: _audit(world, coordinator, epoch) for epoch in (E0, E1, E2, E3)}
    coordinator.judge_audit(world.sink_id, E0, FAILED_CHECKS[:1], write_id=writes[E0].write_id)
    coordinator.commit(world.sink_id, E0)
    coordinator.judge_audit(world.sink_id, E2, FAILED_CHECKS, write_id=writes[E2].write_id)
    coordinator.judge_audit(world.sink_id, E3, FAILED_CHECKS[:1], write_id=writes[E3].write_id)
    return coordinator, writes


def test_show_epochs_and_status_say_where_each_audit_stands(world: World) -> None:
    url, sink_id = world.pipeline.meta_url, world.sink_id
    _, writes = _stages(world)
    plain = write(world, E3 + 1)  # an epoch of no audit yet shows as any Pending epoch
    world.pipeline.coordinator(sink_id, world.pipeline.iceberg_committer()).persist(plain, dag_id="audited")

    code, out, err = run_main("show", sink_id, str(E2), "--url", url, "--json")
    assert code == EXIT_OK, err
    shown = json.loads(out)["epoch"]
    assert shown["status"] == "Pending"
    snapshots = shown["audit"].pop("snapshots")
    assert shown["audit"] == {
        "stage": "Audit failed",
        "branch": audit_branch_name(sink_id, E2),
        "verdict": "failed",
        "failed": [{"name": "no_null_ids", "message": "3 rows break the check"}],
    }
    table = world.pipeline.catalog.load_table(world.table)
    assert snapshots == {world.table: str(table.metadata.refs[audit_branch_name(sink_id, E2)].snapshot_id)}
    code, out, _ = run_main("show", sink_id, str(E2), "--url", url)
    assert code == EXIT_OK
    lines = out.splitlines()
    assert [line.split(None, 1)[1].strip() for line in lines if line.startswith(("stage", "audit_"))] == [
        "Audit failed",
        audit_branch_name(sink_id, E2),
        f"{world.table} -> {snapshots[world.table]}",
        "failed",
    ]
    [failed] = [line for line in lines if line.startswith("no_null_ids")]
    assert failed.split(None, 1)[1].strip() == "3 rows break the check"
    code, out, _ = run_main("show", sink_id, str(E1), "--url", url)
    assert code == EXIT_OK and "not judged yet" in out and "failed check" not in out
    # An epoch of no audit: neither its JSON nor its table says anything of one.
    code, out, _ = run_main("show", sink_id, str(E3 + 1), "--url", url, "--json")
    assert "audit" not in json.loads(out)["epoch"]
    code, out, _ = run_main("show", sink_id, str(E3 + 1), "--url", url)
    assert "stage" not in out and "audit_" not in out
    # The published epoch keeps its audit as the record of the audit passed.
    code, out, _ = run_main("show", sink_id, str(E0), "--url", url, "--json")
    published = json.loads(out)["epoch"]
    assert (published["status"], published["audit"]["stage"], published["audit"]["verdict"]) == (
        "Committed",
        "Committed",
        "passed",
    )

    code, out, err = run_main("epochs", sink_id, "--url", url)
    assert code == EXIT_OK, err
    statuses = {}
    for line in out.splitlines():
        if line.startswith(sink_id):
            epoch = int(line.split("(", 1)[1].split(")", 1)[0])
            statuses[epoch] = line
    assert "Committed" in statuses[E0] and "(Audit" not in statuses[E0]
    assert "Pending (Auditing)" in statuses[E1]
    assert "Pending (Audit failed)" in statuses[E2]
    assert "Pending (Audited)" in statuses[E3]
    assert "Pending (" not in statuses[E3 + 1]

    code, out, err = run_main("status", sink_id, "--url", url)
    assert code == EXIT_OK, err
    assert f"sink {sink_id}: 3 epoch(s) wait for an audit (1 Auditing, 1 Audit failed, 1 Audited)" in out
    [failed_line] = [line for line in out.splitlines() if line.strip().startswith("Audit failed:")]
    assert f"({E2})" in failed_line and f"({E1})" not in failed_line
    assert f"eo-sink reject {sink_id} EPOCH" in out
    code, out, _ = run_main("status", sink_id, "--url", url, "--json")
    assert json.loads(out)["awaiting_audit"] == [
        {"sink_id": sink_id, "epoch": E1, "stage": "Auditing"},
        {"sink_id": sink_id, "epoch": E2, "stage": "Audit failed"},
        {"sink_id": sink_id, "epoch": E3, "stage": "Audited"},
    ]
    assert all(exists(pre) for pre in writes.values())


def test_status_of_a_sink_with_no_audit_says_nothing_of_audits(world: World) -> None:
    url, sink_id = world.pipeline.meta_url, world.sink_id
    pre = write(world, E1)
    world.pipeline.coordinator(sink_id, world.pipeline.iceberg_committer()).persist(pre, dag_id="hourly")
    code, out, _ = run_main("status", sink_id, "--url", url, "--json")
    assert code == EXIT_OK and "awaiting_audit" not in json.loads(out)
    code, out, _ = run_main("status", sink_id, "--url", url)
    assert code == EXIT_OK and "audit" not in out


def test_reject_drops_only_a_write_whose_audit_failed(world: World) -> None:
    url, sink_id = world.pipeline.meta_url, world.sink_id
    _, writes = _stages(world)
    branch = audit_branch_name(sink_id, E2)

    for epoch, stage in ((E1, "Auditing"), (E3, "Audited"), (E0, "Committed")):
        code, out, err = run_main("reject", sink_id, str(epoch), "--reason", "bad rows", "--url", url, "--dry-run")
        assert code == EXIT_OK, err
        assert out.startswith(f"[dry run] reject sink '{sink_id}' epoch {epoch}: refused: the epoch is {stage}"), out
        code, out, err = run_main("reject", sink_id, str(epoch), "--reason", "bad rows", "--url", url, "--json")
        assert code == EXIT_FAILED and "AbortRefused" in err and "only a write whose audit failed" in err
        assert json.loads(out)["error"] == "AbortRefused"
    assert world.pipeline.store.get(sink_id, E1).status is EpochStatus.PENDING  # type: ignore[union-attr]
    assert world.pipeline.store.get(sink_id, E3).status is EpochStatus.PENDING  # type: ignore[union-attr]

    code, out, err = run_main("reject", sink_id, str(E2), "--reason", "bad rows", "--url", url, "--dry-run", "--json")
    assert code == EXIT_OK, err
    planned = json.loads(out)
    assert (planned["outcome"], planned["dry_run"]) == ("would reject", True)
    assert "failed checks: no_null_ids: 3 rows break the check" in planned["detail"]
    assert world.pipeline.store.get(sink_id, E2).stage == "Audit failed"  # type: ignore[union-attr]
    assert exists(writes[E2]) and branch in world.pipeline.catalog.load_table(world.table).metadata.refs

    code, out, err = run_main("reject", sink_id, str(E2), "--reason", "bad rows", "--url", url)
    assert code == EXIT_OK, err
    assert out.startswith(f"reject sink '{sink_id}' epoch {E2}: aborted"), out
    row = world.pipeline.store.get(sink_id, E2)
    assert row is not None and row.status is EpochStatus.ABORTED and row.abort_cause is AbortCause.REJECTED
    assert "bad rows" in (row.error or "")
    assert not exists(writes[E2])
    assert branch not in world.pipeline.catalog.load_table(world.table).metadata.refs
    main_rows = read_branch(world.pipeline.catalog.load_table(world.table), "main", "epoch, write_id")
    assert set(main_rows) == {(E0, writes[E0].write_id)}  # main holds the published epoch only, read by DuckDB
    code, out, _ = run_main("history", sink_id, str(E2), "--url", url, "--json")
    events = [e["event"] for e in json.loads(out)["history"]]
    assert events[:4] == ["persisted", "audit committed", "audit failed", "aborted"]


def test_a_stale_run_of_an_audited_epoch_is_settled_as_its_stage_allows(world: World) -> None:
    # The command that settles an epoch after its run is failed by hand (operations.stale_runs): an
    # audit that failed is rejected (its publish would be refused), one that never concluded is
    # audited again by its run, one that passed is published.
    from airflow_provider_exactly_once.operations import SinkOperations, stale_runs

    _stages(world)
    ops, sink_id = SinkOperations(world.pipeline.store), world.sink_id

    def then(epoch: int) -> str:
        candidate = stale_runs.Candidate(sink_id, epoch, "Pending", "audited", f"scheduled__{epoch}")
        return stale_runs._settling(ops, candidate, candidate.run_id)

    assert (
        then(E2) == f"eo-sink reject {sink_id} {E2} --reason 'its audit failed; run scheduled__{E2} will never finish'"
    )
    assert then(E1).startswith(f"clear the audit tasks of run scheduled__{E1}")
    assert then(E3) == f"eo-sink commit {sink_id} {E3}"
    code, _, err = run_main(
        "reject", sink_id, str(E2), "--reason", "its audit failed", "--url", world.pipeline.meta_url
    )
    assert code == EXIT_OK, err
