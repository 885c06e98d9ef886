"""``eo-sink`` end to end: as a real subprocess (the installed console script) for the contract that
scripts rely on (JSON on stdout, messages on stderr, exit codes), and in process for the rest."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import text

from airflow_provider_exactly_once.cli.main import EXIT_BUSY, EXIT_FAILED, EXIT_OK, EXIT_USAGE, duration, main
from airflow_provider_exactly_once.core.epochs import CheckpointStatus, EpochStatus
from airflow_provider_exactly_once.sinks.config import FileSinkConfig, IcebergSinkConfig
from tests.operations.helpers import coordinator, register, state, write
from tests.recovery.helpers import E0, E1, E2, E3, GRACE, exists, leave_crash
from tests.support.airflow_world import World
from tests.support.builders import empty_write, free_port

EO_SINK = Path(sys.executable).with_name("eo-sink")


def eo_sink(*args: str) -> subprocess.CompletedProcess[str]:
    """The installed script, in a child process that inherits this test's Airflow connections."""
    assert EO_SINK.exists(), f"{EO_SINK} is missing: run `uv sync --frozen` to install the project's scripts"
    return subprocess.run([str(EO_SINK), *args], capture_output=True, text=True, timeout=300, env=dict(os.environ))


def run_main(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(args), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_the_script_reports_status_shows_refuses_and_commits(world: World) -> None:
    url, sink_id = world.pipeline.meta_url, world.sink_id
    pre = write(world, E1)
    coordinator(world).persist(pre, dag_id="hourly", run_id="scheduled__x")
    world.mark(E1, CheckpointStatus.COMPLETED)

    status = eo_sink("status", "--url", url, "--json")
    assert status.returncode == EXIT_OK, status.stderr
    [ours] = [s for s in json.loads(status.stdout)["sinks"] if s["sink_id"] == sink_id]
    assert ours["counts"] == {"pending": 1, "committed": 0, "aborted": 0} and ours["kind"] == "iceberg"

    show = eo_sink("show", sink_id, str(E1), "--url", url, "--json")
    assert show.returncode == EXIT_OK, show.stderr
    shown = json.loads(show.stdout)
    assert shown["epoch"]["write_id"] == pre.write_id and shown["epoch"]["dag_id"] == "hourly"
    assert shown["checkpoint"]["status"] == "COMPLETED"
    assert (shown["delivery"]["how"], shown["delivery"]["tables"]) == ("one table", 1)

    refused = eo_sink("abort", sink_id, str(E1), "--reason", "test", "--url", url, "--json")
    assert refused.returncode == EXIT_FAILED
    assert f"sink '{sink_id}' epoch {E1}" in refused.stderr and "AbortRefused" in refused.stderr
    assert json.loads(refused.stdout)["error"] == "AbortRefused"
    assert exists(pre)

    committed = eo_sink("commit", sink_id, str(E1), "--url", url, "--json")
    assert committed.returncode == EXIT_OK, committed.stderr
    result = json.loads(committed.stdout)
    assert (result["action"], result["outcome"], result["dry_run"]) == ("commit", "committed", False)
    assert world.markers() == {E1: [pre.write_id]}


def test_the_script_exit_codes_for_bad_usage_and_unknown_things(world: World) -> None:
    url = world.pipeline.meta_url
    bad = eo_sink("show", world.sink_id, "not-a-number", "--url", url)
    assert bad.returncode == EXIT_USAGE and "epoch 'not-a-number'" in bad.stderr
    missing = eo_sink("show", world.sink_id, str(E2), "--url", url)
    assert missing.returncode == EXIT_FAILED
    assert f"sink '{world.sink_id}' epoch {E2} was never persisted" in missing.stderr
    assert missing.stdout == ""


def test_tables_by_default_and_json_everywhere(world: World) -> None:
    url, sink_id = world.pipeline.meta_url, world.sink_id
    coord = coordinator(world)
    for epoch in (E0, E1, E2):
        coord.persist(write(world, epoch), dag_id="hourly")
    world.mark(E0, CheckpointStatus.COMPLETED)
    coord.commit(sink_id, E0)

    code, out, _ = run_main("status", sink_id, "--url", url)
    assert code == EXIT_OK
    [line] = [row for row in out.splitlines() if row.startswith(sink_id)]
    assert line.split()[:6] == [sink_id, "iceberg", world.table, "2", "1", "0"]

    code, out, _ = run_main("epochs", sink_id, "--url", url, "--limit", "2")
    assert code == EXIT_OK
    # each epoch as its date with its id beside (E1, E2 stand for instants of 2023-11-14)
    assert [row.split()[1:3] for row in out.splitlines() if row.startswith(sink_id)] == [
        ["2023-11-15T00:13:20Z", f"({E2})"],
        ["2023-11-14T23:13:20Z", f"({E1})"],
    ]
    assert "--offset 2" in out
    code, out, _ = run_main("epochs", sink_id, "--url", url, "--status", "committed", "--json")
    assert [e["epoch"] for e in json.loads(out)["epochs"]] == [E0]

    code, out, _ = run_main("show", sink_id, str(E0), "--url", url)
    assert code == EXIT_OK and "Committed" in out and world.table in out and "COMPLETED" in out
    uuid = str(world.pipeline.catalog.load_table(world.table).metadata.table_uuid)
    assert uuid in out  # which incarnation of the table holds the epoch
    world.pipeline.store.record_warning(sink_id, E0, warning="DAG 'other' wrote this epoch too")
    code, out, _ = run_main("show", sink_id, str(E0), "--url", url)
    assert code == EXIT_OK and "DAG 'other' wrote this epoch too" in out

    for args in (
        ("abort", sink_id, str(E1), "--reason", "r", "--dry-run"),
        ("commit", sink_id, str(E0), "--dry-run"),
        ("cleanup", sink_id, str(E1), "--dry-run"),
        ("recover", sink_id, "--dry-run"),
        ("gc", sink_id, "--grace", "1h", "--dry-run"),
    ):
        code, out, err = run_main(*args, "--url", url, "--json")
        assert code == EXIT_OK, err
        parsed = json.loads(out)
        assert parsed["dry_run"] is True and parsed["action"] == args[0]
        code, out, err = run_main(*args, "--url", url)
        assert code == EXIT_OK and out.startswith(f"[dry run] {args[0]} sink '{sink_id}'"), out


def test_dry_runs_change_nothing_then_the_actions_do(world: World) -> None:
    left = leave_crash(world, world.iceberg_sink())
    url, sink_id = world.pipeline.meta_url, world.sink_id
    writes = [left.pending_completed, left.pending_failed, left.aborted_with_files, left.old_orphan]
    before = state(world, sink_id, [E0, E1, E2, E3], writes)
    for args in (
        ("abort", sink_id, str(E2), "--reason", "checkpoint failed"),
        ("commit", sink_id, str(E1)),
        ("cleanup", sink_id, str(E3)),
        ("recover", sink_id),
        ("gc", sink_id),
    ):
        code, _, err = run_main(*args, "--url", url, "--dry-run")
        assert code == EXIT_OK, err
    assert state(world, sink_id, [E0, E1, E2, E3], writes) == before

    code, out, err = run_main("gc", sink_id, "--grace", "6h", "--url", url, "--json")
    assert code == EXIT_OK, err
    assert json.loads(out)["report"]["orphans_removed"] == [left.old_orphan.write_id]
    assert not exists(left.old_orphan)
    code, out, err = run_main("cleanup", sink_id, str(E3), "--url", url)
    assert code == EXIT_OK and "cleaned up" in out and not exists(left.aborted_with_files)
    code, out, err = run_main("abort", sink_id, str(E2), "--reason", "checkpoint failed", "--url", url)
    assert code == EXIT_OK and "aborted" in out and not exists(left.pending_failed)
    code, out, err = run_main("commit", sink_id, str(E1), "--url", url)
    assert code == EXIT_OK and "committed" in out
    store = world.pipeline.store
    assert store.get(sink_id, E1).status is EpochStatus.COMMITTED  # type: ignore[union-attr]
    assert store.get(sink_id, E2).status is EpochStatus.ABORTED  # type: ignore[union-attr]
    assert world.markers() == {E0: [left.committed.write_id], E1: [left.pending_completed.write_id]}

    # an Aborted epoch's files are counted as what they were, and said to be gone
    code, out, err = run_main("show", sink_id, str(E2), "--url", url, "--json")
    shown = json.loads(out)["epoch"]
    assert (shown["status"], shown["files"] > 0, shown["files_state"]) == ("Aborted", True, "deleted")
    assert (
        json.loads(run_main("show", sink_id, str(E1), "--url", url, "--json")[1])["epoch"]["files_state"] == "visible"
    )

    # the epoch's history names the operator and why (``eo-sink history``)
    code, out, err = run_main("history", sink_id, str(E2), "--url", url, "--json")
    assert code == EXIT_OK, err
    events = json.loads(out)["history"]
    aborted = [e for e in events if e["event"] == "aborted"]
    assert len(aborted) == 1 and aborted[0]["actor"] == "cli" and "@" in aborted[0]["actor_name"]
    assert "checkpoint failed" in aborted[0]["reason"] and events[-1]["event"] == "cleaned up"
    code, out, err = run_main("history", sink_id, str(E2), "--url", url)
    assert code == EXIT_OK and "aborted" in out and "cli " in out and "[" in out.splitlines()[0]  # the interval


@pytest.mark.parametrize("backend", ["sqlite"])  # every registered sink of the store: a store of its own
def test_recover_every_registered_sink(world: World) -> None:
    left = leave_crash(world, world.iceberg_sink())
    code, out, err = run_main("recover", "--url", world.pipeline.meta_url, "--json")
    assert code == EXIT_OK, err
    [result] = json.loads(out)["results"]
    assert result["sink_id"] == world.sink_id and result["ok"] is True
    assert (result["report"]["committed"], result["report"]["aborted"]) == ([E1], [E2])
    assert not exists(left.old_orphan) and exists(left.young_orphan)
    assert timedelta(hours=6) == GRACE  # the young orphan is kept by the default grace


@pytest.mark.parametrize("backend", ["sqlite"])  # every registered sink of the store: a store of its own
def test_gc_over_every_sink_skips_a_sink_another_recovery_holds_and_collects_the_others(world: World) -> None:
    held = leave_crash(world, world.iceberg_sink())
    free = leave_crash(world, FileSinkConfig(f"{world.sink_id}-files", str(world.tmp / "other-files")))
    registry, url = world.pipeline.store.registry, world.pipeline.meta_url
    acquired, _, _ = registry.acquire_sink_lock(world.sink_id, "recovery-run-7", ttl=timedelta(minutes=5))
    assert acquired

    code, out, err = run_main("gc", "--url", url, "--json")
    assert code == EXIT_BUSY, err
    results = {r["sink_id"]: r for r in json.loads(out)["results"]}
    skipped, collected = results[world.sink_id], results[free.sink.sink_id]
    assert (skipped["outcome"], skipped["error"], skipped["retryable"]) == ("skipped", "SinkLocked", True)
    assert "'recovery-run-7'" in skipped["detail"] and f"eo-sink gc {world.sink_id}" in skipped["detail"]
    assert collected["ok"] is True and collected["report"]["orphans_removed"] == [free.old_orphan.write_id]
    assert exists(held.old_orphan) and not exists(free.old_orphan)

    code, out, err = run_main("gc", world.sink_id, "--url", url)  # the one sink, asked by name: busy too
    assert code == EXIT_BUSY and "SinkLocked" in err and "'recovery-run-7'" in err
    code, out, _ = run_main("gc", "--url", url)  # text: the skip is a result on stdout, not an error
    assert code == EXIT_BUSY and f"gc sink '{world.sink_id}': skipped" in out

    registry.release_sink_lock(world.sink_id, "recovery-run-7")
    code, out, err = run_main("gc", "--url", url, "--json")
    assert code == EXIT_OK, err
    assert not exists(held.old_orphan) and exists(held.young_orphan) and exists(free.young_orphan)


def test_the_meta_store_connection_is_resolved_through_airflow(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    coordinator(world).persist(write(world, E1))
    code, out, err = run_main("status", world.sink_id, "--meta-conn-id", world.meta_conn_id, "--json")
    assert code == EXIT_OK, err
    assert json.loads(out)["sinks"][0]["counts"]["pending"] == 1
    code, out, err = run_main("status", "--meta-conn-id", "no_such_connection")
    assert code == EXIT_USAGE and "'no_such_connection' does not exist" in err
    code, out, err = run_main("status", "--url", "mysql://nope/db")
    assert code == EXIT_USAGE and "not supported" in err
    # Without --meta-conn-id, the provider's configured connection, as the tasks resolve it.
    monkeypatch.setenv("AIRFLOW__EXACTLY_ONCE__META_CONN_ID", world.meta_conn_id)
    code, out, err = run_main("status", world.sink_id, "--json")
    assert code == EXIT_OK and json.loads(out)["sinks"][0]["counts"]["pending"] == 1, err
    monkeypatch.setenv("AIRFLOW__EXACTLY_ONCE__META_CONN_ID", "configured_but_missing")
    code, out, err = run_main("status")
    assert code == EXIT_USAGE and "'configured_but_missing' does not exist" in err


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("6h", timedelta(hours=6)),
        ("1h30m", timedelta(minutes=90)),
        ("2d", timedelta(days=2)),
        ("90", timedelta(seconds=90)),
    ],
)
def test_durations(text: str, expected: timedelta) -> None:
    assert duration(text) == expected


@pytest.mark.parametrize("text", ["", "6x", "h", "-1h", "1h-"])
def test_bad_durations_are_usage_errors(text: str) -> None:
    code, _, _ = run_main("gc", "--grace", text, "--url", "sqlite://")
    assert code == EXIT_USAGE


@pytest.mark.parametrize(
    ("args", "code"),
    [
        ((), EXIT_USAGE),
        (("--help",), EXIT_OK),
        (("frobnicate",), EXIT_USAGE),
        (("abort", "some-sink", "5"), EXIT_USAGE),  # --reason is required
        (("show", "bad sink id!", "5"), EXIT_USAGE),
        (("epochs", "--limit", "0"), EXIT_USAGE),
        (("status", "--url", "sqlite://", "--meta-conn-id", "x"), EXIT_USAGE),  # one meta store, not two
    ],
)
def test_usage_errors_exit_2(args: tuple[str, ...], code: int) -> None:
    assert run_main(*args)[0] == code


def test_commit_beyond_the_horizon_is_refused_until_the_operator_says_so(world: World) -> None:
    url, sink_id = world.pipeline.meta_url, world.sink_id
    table = world.pipeline.catalog.load_table(world.table)
    with table.transaction() as tx:  # the table keeps one hour of snapshots
        tx.set_properties({"history.expire.max-snapshot-age-ms": str(3_600_000)})
    pre = write(world, E1)
    coordinator(world).persist(pre, dag_id="hourly")
    world.mark(E1, CheckpointStatus.COMPLETED)
    with world.pipeline.store.engine.begin() as conn:  # written two hours ago and left Pending since
        conn.execute(
            text("UPDATE pending_sink_state SET created_at = :t WHERE sink_id = :s"),
            {"t": (world.pipeline.store.now() - timedelta(hours=2)).replace(tzinfo=None), "s": sink_id},
        )

    refused = eo_sink("commit", sink_id, str(E1), "--url", url)
    assert refused.returncode == EXIT_FAILED and "MarkerHorizonExceeded" in refused.stderr
    assert world.markers() == {}

    committed = eo_sink("commit", sink_id, str(E1), "--beyond-horizon", "--url", url, "--json")
    assert committed.returncode == EXIT_OK, committed.stderr
    assert json.loads(committed.stdout)["outcome"] == "committed"
    assert world.markers() == {E1: [pre.write_id]}


def test_a_persons_commit_and_its_dry_run_list_every_file_of_a_fresh_epoch(world: World) -> None:
    """Issue 59: the commit task of a fresh epoch checks only the manifest persist wrote; a person's
    commit, like recovery, is off that path and lists every data file, as its dry run says."""
    url, sink_id = world.pipeline.meta_url, world.sink_id
    pre = write(world, E1)
    coordinator(world).persist(pre, dag_id="hourly")
    world.mark(E1, CheckpointStatus.COMPLETED)
    row = world.pipeline.store.get(sink_id, E1)
    assert row is not None and row.pre_commit.tables[0].prepared is not None  # the manifest stays
    lost = pre.tables[0].data_files[0].path
    os.remove(lost.removeprefix("file://"))

    planned = eo_sink("commit", sink_id, str(E1), "--dry-run", "--url", url)
    assert planned.returncode == EXIT_FAILED and "MissingDataFiles" in planned.stderr and lost in planned.stderr
    failed = eo_sink("commit", sink_id, str(E1), "--url", url)
    assert failed.returncode == EXIT_FAILED and "MissingDataFiles" in failed.stderr and lost in failed.stderr
    row = world.pipeline.store.get(sink_id, E1)
    assert row is not None and row.status is EpochStatus.PENDING and row.commit_decided_at is None
    assert world.markers() == {}


def test_files_lost_gives_up_a_decided_write_after_a_dry_run_that_lists_what_is_gone(world: World) -> None:
    url, sink_id = world.pipeline.meta_url, world.sink_id
    pre = write(world, E1)
    coordinator(world).persist(pre, dag_id="hourly")
    world.mark(E1, CheckpointStatus.COMPLETED)
    world.pipeline.store.decide_commit(sink_id, E1, write_id=pre.write_id)  # then the commit task died
    lost = pre.tables[0].data_files[0].path
    os.remove(lost.removeprefix("file://"))

    refused = eo_sink("abort", sink_id, str(E1), "--reason", "lifecycle rule", "--url", url)
    assert refused.returncode == EXIT_FAILED and "--files-lost" in refused.stderr
    failed = eo_sink("commit", sink_id, str(E1), "--url", url)
    assert failed.returncode == EXIT_FAILED and "MissingDataFiles" in failed.stderr and "--files-lost" in failed.stderr
    before = state(world, sink_id, [E1], [pre])

    planned = eo_sink(
        "abort", sink_id, str(E1), "--reason", "lifecycle rule", "--files-lost", "--dry-run", "--url", url
    )
    assert planned.returncode == EXIT_OK, planned.stderr
    assert "would abort" in planned.stdout and "1 data file(s) lost" in planned.stdout and lost in planned.stdout
    assert state(world, sink_id, [E1], [pre]) == before

    done = eo_sink("abort", sink_id, str(E1), "--reason", "lifecycle rule", "--files-lost", "--url", url, "--json")
    assert done.returncode == EXIT_OK, done.stderr
    assert json.loads(done.stdout)["outcome"] == "aborted"
    row = world.pipeline.store.get(sink_id, E1)
    assert row is not None and row.status is EpochStatus.ABORTED
    assert not exists(pre) and world.markers() == {}


def test_show_lists_the_revisions_of_a_reprocessed_epoch(world: World) -> None:
    url, sink_id, pipeline = world.pipeline.meta_url, world.sink_id, world.pipeline
    coord = pipeline.coordinator(sink_id, pipeline.iceberg_committer(), on_reprocess={sink_id: "replace"})
    world.mark(E1, CheckpointStatus.COMPLETED)
    writes = [
        write(world, E1).model_copy(update={"generation": f"2024-06-0{n + 1}T00:00:00.000000Z/000000000{n}"})
        for n in range(2)
    ]
    for pre in writes:
        coord.persist(pre, run_id="scheduled__x", try_number=1, dag_id="hourly")
        coord.commit(sink_id, E1)

    code, out, err = run_main("show", sink_id, str(E1), "--url", url)
    assert code == EXIT_OK, err
    revisions = out.split("revision", 1)[1]
    assert "Replaced" in out and writes[0].write_id in out and writes[1].write_id in out
    assert "generation" in revisions and "2024-06-02T00:00:00.000000Z/0000000001" in out


def test_show_names_the_upstream_range_an_incremental_epoch_consumed(world: World) -> None:
    from airflow_provider_exactly_once.core.input_ranges import SnapshotRange

    consumed = SnapshotRange(table="bronze.events", after_snapshot_id=7, to_snapshot_id=9)
    pre = write(world, E1).model_copy(update={"source_positions": consumed.positions(snapshots=2)})
    world.pipeline.store.insert_pending(pre, run_id="scheduled__x", try_number=1, dag_id="hourly")
    code, out, err = run_main("show", world.sink_id, str(E1), "--url", world.pipeline.meta_url)
    assert code == EXIT_OK, err
    assert "consumed" in out and "bronze.events: after snapshot 7 to snapshot 9" in out
    code, out, err = run_main("show", world.sink_id, str(E1), "--url", world.pipeline.meta_url, "--json")
    assert json.loads(out)["epoch"]["consumed"] == "bronze.events: after snapshot 7 to snapshot 9"


def test_abort_settles_an_incremental_epoch_whose_write_never_persisted(world: World) -> None:
    """Its reserved range holds the next epoch back until it settles: the abort records it Aborted,
    and the next epoch's range starts where the last committed one ended, covering it."""
    from airflow_provider_exactly_once.core.errors import EarlierEpochUndecided
    from airflow_provider_exactly_once.core.input_ranges import SnapshotRange
    from airflow_provider_exactly_once.runtime.run_epochs import reserved_range

    store, sink_id, url = world.pipeline.store, world.sink_id, world.pipeline.meta_url
    register(world, world.iceberg_sink())
    reserved = reserved_range(store, sink_id, E1, "bronze.events", lambda: 5)
    assert reserved == SnapshotRange(table="bronze.events", to_snapshot_id=5)
    with pytest.raises(EarlierEpochUndecided):
        reserved_range(store, sink_id, E2, "bronze.events", lambda: 6)
    code, out, err = run_main("abort", sink_id, str(E1), "--url", url, "--reason", "never finished", "--dry-run")
    assert code == EXIT_OK and "would abort" in out and "goes to the next epoch" in out, (out, err)
    assert store.get(sink_id, E1) is None
    code, out, err = run_main("abort", sink_id, str(E1), "--url", url, "--reason", "never finished")
    assert code == EXIT_OK, (out, err)
    assert store.get(sink_id, E1).status is EpochStatus.ABORTED  # type: ignore[union-attr]
    assert reserved_range(store, sink_id, E2, "bronze.events", lambda: 6) == SnapshotRange(
        table="bronze.events", to_snapshot_id=6
    )


def test_show_says_how_the_sinks_epochs_reach_its_tables_even_when_its_catalog_is_down(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, pipeline = world.pipeline.meta_url, world.pipeline
    pipeline.create_table("clicks")
    fan_out = IcebergSinkConfig(
        f"{world.sink_id}-fan", (world.table, f"{pipeline.namespace}.clicks"), iceberg_conn_id=world.iceberg_conn_id
    )
    register(world, fan_out)
    pipeline.store.insert_pending(
        empty_write(fan_out.sink_id, E1, world.table, f"file://{world.tmp}/fan"), run_id=None, try_number=None
    )
    code, out, err = run_main("show", fan_out.sink_id, str(E1), "--url", url)
    assert code == EXIT_OK, err
    [line] = [row for row in out.splitlines() if row.startswith("delivery ")]
    assert line.split(None, 1)[1] == (
        f"atomic across its 2 tables, one catalog transaction (SQL catalog {world.iceberg_conn_id!r} moves every "
        "table's pointer in one database transaction, so a reader sees an epoch in all of them or in none)"
    )

    dead_port = free_port()
    dead_conn_id = f"iceberg_down_{world.sink_id}"
    dead_uri = f"postgresql+psycopg2://eo:Planted-pw@127.0.0.1:{dead_port}/catalog"
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{dead_conn_id.upper()}",
        json.dumps({"conn_type": "iceberg", "extra": {"type": "sql", "uri": dead_uri}}),
    )
    down = IcebergSinkConfig(f"{world.sink_id}-down", fan_out.tables, iceberg_conn_id=dead_conn_id)
    register(world, down)
    pipeline.store.insert_pending(
        empty_write(down.sink_id, E1, world.table, f"file://{world.tmp}/down"), run_id=None, try_number=None
    )
    code, out, err = run_main("show", down.sink_id, str(E1), "--url", url, "--json")
    assert code == EXIT_OK, err
    delivery = json.loads(out)["delivery"]
    assert (delivery["how"], delivery["tables"]) == ("unknown", 2)
    assert delivery["why"].startswith("SinkUnavailable: ") and f"eo:***@127.0.0.1:{dead_port}" in delivery["why"]
    code, out, err = run_main("show", down.sink_id, str(E1), "--url", url)
    assert code == EXIT_OK and "unknown: SinkUnavailable: " in out and "Planted-pw" not in out + err
