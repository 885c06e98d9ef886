"""The named fault scenarios of the harness, and the seed-driven random plans.

``named_scenarios`` is every scenario by name (``scripts/faults --list``); ``scenarios_for`` those a
stack can run, and why it cannot run the others; ``random_plan`` turns a seed into pipelines whose
every epoch is faulted, so a seed replays the same plan (on either stack).
"""

from __future__ import annotations

import random

from fault_harness.actions import (
    drop_commit_response,
    kill_catalog,
    kill_component,
    kill_spark_connect,
    kill_task,
    kill_worker_of,
    late_after,
    other_writer,
    second_committer,
    settle_late,
    stop_meta_store,
)
from fault_harness.cluster import ICEBERG_CONN_ID
from fault_harness.incremental import kills_fired, reprocess_incremental
from fault_harness.layout import WRITE_POINT
from fault_harness.plans import Action, Rule, Scenario
from fault_harness.reprocessing import (
    REVISION_POINTS,
    RevisionFault,
    backfill_overlap,
    clear_runs,
    reprocess,
    revision_given_up,
)
from fault_harness.stacks import PROXIED_ICEBERG_CONN_ID
from fault_harness.upsert_actions import compaction_rule, concurrent_compaction

#: How long ``catalog_restart`` keeps SeaweedFS down: inside the 10-30 s of the issue, and within what
#: a commit's retries (6, 2 s apart, each a task start of several seconds) outlast.
CATALOG_DOWN_S = 20.0


#: The kill points of ``incremental_kills``, one per epoch in turn: after the write's files exist,
#: around persist, after the commit's decision, inside the Iceberg commit (before / after the
#: catalog update), after the commit before its mark, after the mark.
INCREMENTAL_KILL_POINTS = (
    WRITE_POINT,
    "persist.staged",
    "persist.inserted",
    "commit.decided",
    "iceberg.before_catalog_update",
    "iceberg.after_catalog_update",
    "commit.visible",
    "commit.marked",
)
#: ``incremental_kills_short``'s, for CI: each kind once in 6 epochs, the last epoch's (most often
#: an empty range, which passes no catalog update) one every write reaches.
INCREMENTAL_CI_KILL_POINTS = (
    WRITE_POINT,
    "persist.inserted",
    "commit.decided",
    "iceberg.before_catalog_update",
    "iceberg.after_catalog_update",
    "commit.visible",
)


#: ``fan_out_kill_transaction``'s kill points, one per epoch: the steps of a SQL catalog's fan-out
#: commit (``sinks/iceberg/transaction.py``, ``SqlPointerMoves``), each reached once by every fan-out epoch.
FAN_OUT_TRANSACTION_POINTS = (
    "iceberg.metadata_written",
    "iceberg.in_catalog_transaction",
    "iceberg.after_catalog_update",
    "iceberg.before_catalog_update",
)
FAN_OUT_TRANSACTION_RULES = tuple(Rule(n, point) for n, point in enumerate(FAN_OUT_TRANSACTION_POINTS))


#: The steps write, audit, publish adds (design.md D23), as an audited pipeline reaches them: the
#: audit commit after its catalog commit (before its row records it), the publish after it recorded
#: the audit passed, then the publish's commit: decided, visible on ``main``, marked Committed.
AUDIT_POINTS = ("audit.committed", "audit.ran", "commit.decided", "commit.visible", "commit.marked")
AUDIT_KILL_RULES = (
    *(Rule(n, point) for n, point in enumerate(AUDIT_POINTS)),
    # A bad hour: its audit commit killed, its audit then failing; it must never reach main.
    Rule(len(AUDIT_POINTS), "audit.committed"),
)


def incremental_kills(name: str, points: tuple[str, ...], epochs: int) -> Scenario:
    """An incremental pipeline of ``epochs`` epochs, the producer appending to its upstream, each
    epoch's first try killed -9 at ``points[n % len(points)]``; the scenario fails unless every kill fired."""
    rules = tuple(Rule(n, points[n % len(points)]) for n in range(epochs))
    return Scenario(
        name,
        epochs=epochs,
        mode="incremental",
        max_active_runs=1,
        rules=rules,
        actions=(kills_fired(rules),),
        description=f"incremental pipeline, {epochs} epochs reading an upstream Iceberg table the producer appends to: "
        f"each epoch killed -9 at another step ({', '.join(points)}, in turn); every upstream row delivered once",
    )


def named_scenarios() -> dict[str, Scenario]:
    """Every scenario of the issue, by name."""
    scenarios = [
        Scenario(
            "kill_spark_write",
            epochs=1,
            writer="spark",
            actions=(kill_task("transform", with_java_child=True),),
            description="kill -9 of the task process during the Spark write (real spark-submit)",
        ),
        Scenario(
            "kill_connect_write",
            epochs=2,
            writer="connect",
            write_pause_s=0.5,
            actions=(kill_spark_connect(),),
            description="kill -9 of the Spark Connect server while it runs a write, restarted 3 s later",
        ),
        Scenario(
            "upsert_kill_connect",
            epochs=2,
            mode="upsert",
            max_active_runs=1,
            writer="connect",
            write_pause_s=0.5,
            actions=(kill_spark_connect(),),
            description="upsert pipeline through Spark Connect: the server killed -9 while it reads an epoch's "
            "changes, restarted 3 s later",
        ),
        Scenario(
            "kill_light_write",
            epochs=1,
            rules=(Rule(0, WRITE_POINT),),
            description="kill -9 of the write task after its files exist, before it returns them",
        ),
        Scenario(
            "kill_after_staging",
            epochs=1,
            rules=(Rule(0, "persist.staged"),),
            description="kill -9 after persist wrote the epoch's manifest, before its row",
        ),
        Scenario(
            "kill_after_persist", epochs=1, rules=(Rule(0, "persist.inserted"),), description="kill -9 after persist"
        ),
        Scenario(
            "kill_sensor_wait",
            epochs=1,
            late_hours=frozenset({0}),
            actions=(kill_task("events.wait_for_checkpoint", then=settle_late),),
            description="kill -9 of the sensor's task process while it waits",
        ),
        Scenario(
            "kill_before_catalog_update",
            epochs=1,
            rules=(Rule(0, "iceberg.before_catalog_update"),),
            description="kill -9 inside the Iceberg commit, before the catalog update",
        ),
        Scenario(
            "kill_after_catalog_update",
            epochs=1,
            rules=(Rule(0, "iceberg.after_catalog_update"),),
            description="kill -9 inside the Iceberg commit, after the catalog update",
        ),
        Scenario(
            "kill_before_mark",
            epochs=1,
            rules=(Rule(0, "commit.visible"),),
            description="kill -9 after the commit, before the Committed mark",
        ),
        Scenario(
            "kill_during_abort",
            epochs=1,
            failed_hours=frozenset({0}),
            rules=(Rule(0, "abort.marked"),),
            description="kill -9 during the abort of a failed checkpoint (marked, files not yet deleted)",
        ),
        Scenario(
            "kill_scheduler",
            epochs=2,
            actions=(kill_component("scheduler", when_task="transform"),),
            description="kill -9 of the scheduler (and its LocalExecutor's task processes)",
        ),
        Scenario(
            "kill_triggerer",
            epochs=1,
            sensor="deferrable",
            late_hours=frozenset({0}),
            actions=(kill_component("triggerer", when_task="events.wait_for_checkpoint", state="deferred"),),
            description="kill -9 of the triggerer while a deferred sensor waits",
        ),
        Scenario(
            "meta_store_outage",
            epochs=2,
            actions=(stop_meta_store(when_task="transform"),),
            description="the meta store stopped (immediate) and restarted while epochs run",
        ),
        Scenario(
            "failed_checkpoint",
            epochs=2,
            failed_hours=frozenset({1}),
            description="a checkpoint that fails: the epoch is aborted, nothing of it visible",
        ),
        Scenario(
            "zombie",
            epochs=1,
            rules=(Rule(0, "iceberg.loaded", mode="pause", seconds=25),),
            actions=(second_committer(0),),
            description="the same epoch committed by two live attempts at once",
        ),
        Scenario(
            "other_writer",
            epochs=2,
            actions=(other_writer(),),
            description="another writer appending to the same table while epochs commit",
        ),
        Scenario(
            "clear_successful",
            epochs=2,
            actions=(clear_runs,),
            description="a user clearing successful runs: every task runs again, each epoch replaced by the same rows",
        ),
        Scenario(
            "backfill_overlap",
            epochs=2,
            max_active_runs=1,
            actions=(backfill_overlap,),
            description="a reprocess backfill over the range while the scheduled runs are still going",
        ),
        Scenario(
            "reprocess_completed",
            epochs=3,
            actions=(reprocess("backfill", [0, 1], show=0),),
            description="input of two committed hours changed, then a backfill --reprocess-behavior completed of them",
        ),
        Scenario(
            "reprocess_failed",
            epochs=3,
            failed_hours=frozenset({1}),
            actions=(reprocess("backfill_failed", [1], complete=[1], show=1),),
            description="a failed hour landed anew with _SUCCESS, then a backfill --reprocess-behavior failed",
        ),
        Scenario(
            "clear_via_api",
            epochs=2,
            actions=(reprocess("api", [0], show=0),),
            description="input of a committed hour changed, then its run cleared through the REST API",
        ),
        Scenario(
            "kill_during_replacement",
            epochs=len(REVISION_POINTS),
            actions=(
                reprocess(
                    "clear_all",
                    range(len(REVISION_POINTS)),
                    faults=[RevisionFault(n, point) for n, point in enumerate(REVISION_POINTS)],
                ),
            ),
            description="every hour's input changed and its run cleared; each revision killed at another of its steps",
        ),
        Scenario(
            "revision_given_up",
            epochs=1,
            actions=(revision_given_up,),
            description="a re-run whose checkpoint fails gives its revision up (the first write stays); a second one replaces it",
        ),
        Scenario(
            "upsert_kill_commit",
            epochs=3,
            mode="upsert",
            max_active_runs=1,
            rules=(
                Rule(0, "commit.decided"),
                Rule(1, "iceberg.after_catalog_update"),
                Rule(2, "commit.visible"),
            ),
            description="upsert pipeline: each epoch's commit killed -9 at another step (after the decision, "
            "after the catalog update, before the Committed mark); retries and recovery apply each epoch once",
        ),
        Scenario(
            "upsert_failed_hour",
            epochs=3,
            mode="upsert",
            max_active_runs=1,
            failed_hours=frozenset({1}),
            rules=(Rule(0, WRITE_POINT), Rule(1, "abort.marked"), Rule(2, "iceberg.before_catalog_update")),
            description="upsert pipeline: a write killed after its files exist, a failed hour whose abort is "
            "killed after its mark (its changes never applied), a commit killed before the catalog update",
        ),
        Scenario(
            "upsert_compaction",
            epochs=2,
            mode="upsert",
            max_active_runs=1,
            rules=(compaction_rule(1),),
            actions=(concurrent_compaction(1),),
            description="upsert pipeline: a compaction replaces a file holding keys hour 1 changes between its "
            "write and its commit: the commit is refused (UpsertConflict), the epoch written again and committed once",
        ),
        Scenario(
            "kill_celery_worker_during_commit",
            epochs=2,
            # Held just after the catalog update (the epoch visible, not yet marked Committed), so the
            # kill lands where losing the worker costs the most; the retry must find its own marker.
            # On any try: a first try that failed earlier (the catalog down for ``catalog_restart``,
            # which shares it in a run of several scenarios) would otherwise leave nothing to kill.
            rules=(Rule(0, "iceberg.after_catalog_update", mode="pause", seconds=40, try_number=None),),
            actions=(kill_worker_of("events.commit", when_logged="pause at iceberg.after_catalog_update"),),
            description="kill -9 of the Celery worker running the commit (after the catalog update), restarted 5 s later",
        ),
        Scenario(
            "catalog_restart",
            epochs=3,
            actions=(kill_catalog(when_task="events.commit", down_s=CATALOG_DOWN_S),),
            description=f"SeaweedFS (REST catalog and S3) killed -9 while commits run, restarted {CATALOG_DOWN_S:.0f} s later",
        ),
        Scenario(
            "fan_out_kill_commit",
            epochs=3,
            tables=2,
            rules=(
                Rule(0, "iceberg.before_catalog_update"),
                Rule(1, "iceberg.after_catalog_update"),
                Rule(2, "commit.visible"),
            ),
            description="fan-out pipeline (two tables): each epoch's commit killed -9 at another step (before the "
            "catalog update, after it, before the Committed mark); one database transaction on the local stack's "
            "SQL catalog (fan_out_kill_transaction kills inside it), one transactions/commit request on the production stack",
        ),
        Scenario(
            "fan_out_kill_transaction",
            epochs=len(FAN_OUT_TRANSACTION_POINTS),
            tables=2,
            rules=FAN_OUT_TRANSACTION_RULES,
            actions=(kills_fired(FAN_OUT_TRANSACTION_RULES),),
            description="fan-out pipeline (two tables) on the SQL catalog: each epoch's commit killed -9 at another "
            "step of its one database transaction (every table's metadata file written, inside the transaction, after "
            "it, before it); a reader loading the tables throughout never sees an epoch in one only, and gc removes "
            "the metadata files the kills left",
        ),
        Scenario(
            "drop_commit_response",
            epochs=2,
            tables=2,
            conn_id=PROXIED_ICEBERG_CONN_ID,
            actions=(drop_commit_response(),),
            description="fan-out pipeline (two tables): the REST catalog applies their transactions/commit and the "
            "proxy in front of it drops the response",
        ),
        Scenario(
            "audit_kill_points",
            epochs=len(AUDIT_KILL_RULES),
            audited=True,
            bad_hours=frozenset({len(AUDIT_POINTS)}),
            rules=AUDIT_KILL_RULES,
            actions=(kills_fired(AUDIT_KILL_RULES, audited=True),),
            description="audited pipeline (write, audit, publish): each epoch killed -9 at another new step "
            f"({', '.join(AUDIT_POINTS)}, the last three the publish's commit); hour {len(AUDIT_POINTS)} fails its "
            "audit (its audit commit killed too): every passed epoch on main once, the failed one never",
        ),
        incremental_kills("incremental_kills", INCREMENTAL_KILL_POINTS, 50),
        incremental_kills("incremental_kills_short", INCREMENTAL_CI_KILL_POINTS, len(INCREMENTAL_CI_KILL_POINTS)),
        Scenario(
            "incremental_reprocess",
            epochs=5,
            mode="incremental",
            max_active_runs=1,
            failed_hours=frozenset({2}),
            actions=(reprocess_incremental(committed=1, aborted=2),),
            description="incremental pipeline: epoch 2's write crashes on every try (aborted; epoch 3 reads its range); "
            "once the runs ended, committed epoch 1 and aborted epoch 2 are cleared: 1 replays its range (a "
            "revision, the same rows), 2 is refused (InputRangeRefused) and stays aborted",
        ),
        Scenario(
            "incremental_spark",
            epochs=4,
            mode="incremental",
            max_active_runs=1,
            writer="spark",
            actions=(kill_task("transform", with_java_child=True),),
            description="incremental pipeline written by the product's SparkPreCommitOperator (real spark-submit) "
            "reading IcebergTableInput: kill -9 of a task process during its Spark write; the retry reads the same range",
        ),
    ]
    return {s.name: s for s in scenarios}


#: The scenarios a stack cannot run, and why (reported, never silently dropped).
NOT_ON: dict[str, dict[str, str]] = {
    "local": {
        "kill_celery_worker_during_commit": "the local stack has no Celery worker (LocalExecutor): run it with --stack production",
        "catalog_restart": "the local stack's catalog is a database on the shared PostgreSQL: run it with --stack production",
        "drop_commit_response": "the local stack's catalog is a database, not a REST service behind a proxy: "
        "run it with --stack production",
    },
    # kill_spark_write runs there too: spark-submit on the Celery worker, its executors under the
    # standalone worker, writing to the REST catalog's S3 through pyiceberg's FileIO (no s3a).
    "production": {
        "fan_out_kill_transaction": "the production stack's catalog is REST: a fan-out is one transactions/commit "
        "request there, killed before, inside and after it by fan_out_kill_commit",
    },
}


def scenarios_for(stack: str, names: list[str] | None = None) -> tuple[list[Scenario], dict[str, str]]:
    """The named scenarios (all, or ``names``) that ``stack`` can run, and the skipped ones with the reason."""
    known = named_scenarios()
    wanted = list(known) if names is None else names
    skipped = {n: NOT_ON.get(stack, {})[n] for n in wanted if n in NOT_ON.get(stack, {})}
    return [known[n] for n in wanted if n not in skipped], skipped


# -- random plans ---------------------------------------------------------------------------------------

#: Points a random plan may arm on an epoch whose checkpoint completes / fails.
COMMIT_POINTS = (
    WRITE_POINT,
    "persist.inserted",
    "commit.decided",
    "iceberg.loaded",
    "iceberg.before_catalog_update",
    "iceberg.after_catalog_update",
    "commit.visible",
    "commit.marked",
)
ABORT_POINTS = (WRITE_POINT, "persist.inserted", "abort.marked", "abort.cleaned")


def random_plan(
    seed: int, epochs: int, *, per_pipeline: int = 10, stack: str = "local", upserts: bool = True, audits: bool = True
) -> list[Scenario]:
    """Seed -> pipelines of up to ``per_pipeline`` epochs, every epoch faulted: a fault point and
    mode (crash or kill, on the first try, sometimes on the second as well), about one hour in six
    with a failed checkpoint, some hours settled late, one process-level event per pipeline
    (kill -9 of the scheduler or the triggerer, or a meta-store outage) at a random moment, for
    some pipelines a reprocessing of committed hours once their runs ended (``_random_reprocess``),
    and on the production stack one fault of its platform per pipeline (``_random_platform_fault``).
    One pipeline in each five is an upsert pipeline (``is_upsert_pipeline``; ``upserts=False``: none,
    the plans from before upsert pipelines were added), changed by ``_as_upsert``. Some others are
    audited (``is_audited_pipeline``; ``audits=False``: none, the plans from before), changed by
    ``_as_audited``: bad hours whose audit fails, and a kill or crash at a step of write, audit,
    publish per checkpointed hour."""
    rng = random.Random(seed)
    scenarios = []
    for n, first in enumerate(range(0, epochs, per_pipeline)):
        count = min(per_pipeline, epochs - first)
        failed = frozenset(i for i in range(count) if rng.random() < 1 / 6)
        late = frozenset(i for i in range(count) if rng.random() < 0.2)
        rules: list[Rule] = []
        for i in range(count):
            point = rng.choice(ABORT_POINTS if i in failed else COMMIT_POINTS)
            mode = rng.choice(("crash", "kill"))
            rules.append(Rule(i, point, mode=mode, try_number=1))
            if rng.random() < 0.2:
                rules.append(
                    Rule(i, rng.choice(COMMIT_POINTS if i not in failed else ABORT_POINTS), mode=mode, try_number=2)
                )
        sensor = rng.choice(("poke", "reschedule", "deferrable"))
        event = rng.choice(("scheduler", "triggerer", "meta_store", "none"))
        when = rng.choice(("transform", "events.persist", "events.commit"))
        upsert = upserts and is_upsert_pipeline(seed, n)
        audited = audits and not upsert and is_audited_pipeline(seed, n)
        if audited and when == "events.commit":  # an audited pipeline commits by its publish
            when = "events.publish"
        actions: list[Action] = []
        if late:
            actions.append(late_after(rng.uniform(5, 40)))
        if event == "scheduler":
            actions.append(kill_component("scheduler", when_task=when, down_s=rng.uniform(2, 10)))
        elif event == "triggerer":
            actions.append(kill_component("triggerer", when_task=when, down_s=rng.uniform(2, 10)))
        elif event == "meta_store":
            actions.append(stop_meta_store(when_task=when, down_s=rng.uniform(3, 15)))
        # The upsert checker's model applies each epoch's changes once; a revision's (the epoch's
        # changes replaced, every later epoch's kept) is not modelled yet, so an upsert pipeline draws
        # none; nor does an audited one (a revision is audited again: not in the audit checker yet).
        again = None if upsert or audited else _random_reprocess(seed, n, count, failed)
        if again is not None:
            actions.append(again)
        conn_id, platform = ICEBERG_CONN_ID, "none"
        if stack == "production":
            conn_id, platform, fault = _random_platform_fault(seed, n, count, failed, audited=audited)
            if fault is not None:
                actions.append(fault)
        scenario = Scenario(
            f"random_{seed}_{n}",
            epochs=count,
            sensor=sensor,
            failed_hours=failed,
            late_hours=late,
            rules=tuple(rules),
            actions=tuple(actions),
            conn_id=conn_id,
            description=f"seed {seed} pipeline {n}: {sensor} sensor, event {event} at {when}"
            + ("" if stack != "production" else f", platform fault {platform}"),
        )
        scenarios.append(
            _as_upsert(scenario, seed, n) if upsert else _as_audited(scenario, seed, n) if audited else scenario
        )
    return scenarios


#: One pipeline in this many of a random plan is an upsert pipeline.
UPSERT_EVERY = 5


def is_upsert_pipeline(seed: int, n: int) -> bool:
    """Whether pipeline ``n`` of seed ``seed``'s random plan is an upsert pipeline: one in each block
    of ``UPSERT_EVERY`` consecutive pipelines, which one drawn from a generator of the block's own
    (every other draw of the plan stays what it was before upsert pipelines were added)."""
    return random.Random(f"{seed}-upsert-{n // UPSERT_EVERY}").randrange(UPSERT_EVERY) == n % UPSERT_EVERY


#: The share of a random plan's append pipelines that are audited (write, audit, publish), and of an
#: audited pipeline's checkpointed hours whose audit fails.
AUDITED_SHARE = 0.4
BAD_HOUR_SHARE = 0.25


def is_audited_pipeline(seed: int, n: int) -> bool:
    """Whether pipeline ``n`` of seed ``seed``'s random plan is audited (unless it is an upsert
    pipeline), drawn from a generator of its own, so that every other draw stays what it was."""
    return random.Random(f"{seed}-audit-{n}").random() < AUDITED_SHARE


def _as_audited(scenario: Scenario, seed: int, n: int) -> Scenario:
    """Pipeline ``n``'s plan as an audited pipeline (design.md D23): the same faults, hours and events,
    from a generator of its own about one checkpointed hour in four *bad* (its audit fails, so it
    must never reach ``main``), and on the first try of every checkpointed hour a crash or a kill
    at one of write, audit, publish's steps (``AUDIT_POINTS``; a bad hour's at ``audit.committed``,
    the one it reaches), beside the rules it had (those at the commit's points are its publish's)."""
    rng = random.Random(f"{seed}-audit-pipeline-{n}")
    checkpointed = [i for i in range(scenario.epochs) if i not in scenario.failed_hours]
    bad = frozenset(i for i in checkpointed if rng.random() < BAD_HOUR_SHARE)
    rules = list(scenario.rules)
    for i in checkpointed:
        point = "audit.committed" if i in bad else rng.choice(AUDIT_POINTS)
        rules.append(Rule(i, point, mode=rng.choice(("crash", "kill")), try_number=1))
    head, _, tail = scenario.description.partition(": ")
    return Scenario(
        scenario.name,
        epochs=scenario.epochs,
        sensor=scenario.sensor,
        failed_hours=scenario.failed_hours,
        late_hours=scenario.late_hours,
        rules=tuple(rules),
        actions=scenario.actions,
        conn_id=scenario.conn_id,
        audited=True,
        bad_hours=bad,
        description=f"{head}: audited, bad hours {sorted(bad)}, {tail}",
    )


def _as_upsert(scenario: Scenario, seed: int, n: int) -> Scenario:
    """Pipeline ``n``'s plan as an upsert pipeline: the same faults, hours and events, one run at a
    time, and in one of two such pipelines a concurrent compaction of a file an epoch's write
    rewrote, between that write and its commit (``upsert_actions``), drawn from a generator of its
    own. The compacted hour is checkpointed and comes after a checkpointed hour, so that the table
    holds a file to compact; its commit's conflict is only noted (a recovery run started by a
    scheduler kill may commit the epoch before the compaction lands)."""
    rng = random.Random(f"{seed}-upsert-pipeline-{n}")
    rules, actions = list(scenario.rules), list(scenario.actions)
    ok = [k for k in range(1, scenario.epochs) if k not in scenario.failed_hours]
    ok = [k for k in ok if any(i not in scenario.failed_hours for i in range(k))]
    compaction = ""
    if ok and rng.random() < 0.5:
        k = rng.choice(ok)
        rules.insert(0, compaction_rule(k))
        actions.append(concurrent_compaction(k, expect_conflict=False))
        compaction = f", compaction during hour {k}"
    head, _, tail = scenario.description.partition(": ")
    tail, platform, fault = tail.partition(", platform fault")  # the production stack's, kept last
    return Scenario(
        scenario.name,
        epochs=scenario.epochs,
        sensor=scenario.sensor,
        failed_hours=scenario.failed_hours,
        late_hours=scenario.late_hours,
        rules=tuple(rules),
        actions=tuple(actions),
        conn_id=scenario.conn_id,
        mode="upsert",
        max_active_runs=1,
        description=f"{head}: upsert, {tail}{compaction}{platform}{fault}",
    )


def _random_platform_fault(
    seed: int, n: int, count: int, failed: frozenset[int], *, audited: bool = False
) -> tuple[str, str, Action | None]:
    """Pipeline ``n``'s fault of the production platform, from its own generator (so the local
    stack's plan of a seed is the same on both stacks): kill -9 of the Celery worker running one of
    its tasks (restarted 3-10 s later), SeaweedFS (REST catalog and S3) killed while one of its
    commits runs and restarted 10-20 s later, its first commit's response dropped by the proxy (the
    pipeline then commits through it), or none. The connection, the fault's name and the action.

    The outage stays within what every pipeline's tries outlast (it hits them all: their writes,
    sensors on S3 and commits), beside the plan's own crashes of a try or two: an hour whose tries
    all met it would be a run given up, not a fault the product must survive. ``audited``: the
    pipeline commits by its publish (``events.publish``), not ``events.commit``."""
    rng = random.Random(f"{seed}-platform-{n}")
    kind = rng.choice(("celery_worker", "catalog", "drop_response", "none"))
    when = rng.choice(("transform", "events.persist", "events.commit"))
    commit_task = "events.publish" if audited else "events.commit"
    when = commit_task if when == "events.commit" else when
    if kind == "celery_worker":
        return ICEBERG_CONN_ID, f"{kind} at {when}", kill_worker_of(when, down_s=rng.uniform(3, 10))
    if kind == "catalog":
        down_s = rng.uniform(10, 20)
        return ICEBERG_CONN_ID, f"{kind} for {down_s:.0f} s", kill_catalog(when_task=commit_task, down_s=down_s)
    if kind == "drop_response" and len(failed) < count:  # a pipeline that commits nothing has no response to lose
        return PROXIED_ICEBERG_CONN_ID, kind, drop_commit_response()
    return ICEBERG_CONN_ID, "none", None


def _random_reprocess(seed: int, n: int, count: int, failed: frozenset[int]) -> Action | None:
    """Pipeline ``n``'s reprocessing, or none: drawn from its own generator, so that adding it left
    every other draw of a seed's plan as it was. Three pipelines in five re-run one to three of their
    committed hours once every run ended (clears, a reprocess backfill over a range, or REST API
    clears), most with changed input, and three in five of those arm a crash or a kill at one step
    of one revision."""
    rng = random.Random(f"{seed}-reprocess-{n}")
    committed = [i for i in range(count) if i not in failed]
    if rng.random() >= 0.6 or not committed:
        return None
    how = rng.choice(("clear", "backfill", "api"))
    if how == "backfill":
        first = rng.choice(committed)
        hours = list(range(first, min(count - 1, first + rng.randrange(3)) + 1))
        land = [i for i in hours if i not in failed]  # a failed hour's re-run aborts again
    else:
        hours = sorted(rng.sample(committed, k=min(len(committed), rng.randint(1, 3))))
        land = hours
    unchanged = [i for i in land if rng.random() < 0.2]
    faults = []
    if rng.random() < 0.6:
        faults.append(RevisionFault(rng.choice(land), rng.choice(REVISION_POINTS), rng.choice(("crash", "kill"))))
    return reprocess(how, hours, land=land, unchanged=unchanged, faults=faults)
