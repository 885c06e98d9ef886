"""``eo-sink``'s read commands: ``status``, ``epochs``, ``history`` and ``show``; each reads the meta
store (``show`` also the sink's catalog for ``delivery``; ``status`` Airflow's database when an
unsettled epoch's run may never finish) and changes nothing.

Epochs are shown as dates with their ids beside (``parser.epoch_text``). A failed task's log is
linked where Airflow's ``[api] base_url`` is known: from ``AIRFLOW__API__BASE_URL``, or from
Airflow's configuration when the command asked Airflow for its connection already; with ``--url``
nothing of Airflow is imported for it (design.md D20), and its DAG, run, task and try are printed.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from airflow_provider_exactly_once.cli.parser import (
    EXIT_OK,
    age,
    epoch_text,
    instant,
    interval,
    print_json,
    short,
    table,
)
from airflow_provider_exactly_once.core.epochs import AuditStage, EpochStatus
from airflow_provider_exactly_once.core.errors import ExactlyOnceError, mask_userinfo
from airflow_provider_exactly_once.defaults import CONFIG_SECTION
from airflow_provider_exactly_once.operations import SinkOperations, stale_runs
from airflow_provider_exactly_once.operations.views import (
    EpochView,
    FailureView,
    HistoryView,
    SinkSummary,
    StaleRunView,
)
from airflow_provider_exactly_once.store.queries import MAX_PAGE


def _option(section: str, key: str) -> str:
    """An Airflow option: its ``AIRFLOW__SECTION__KEY`` variable, else Airflow's configuration when
    this process imported Airflow already (it asked for the connection), else unset (``""``)."""
    value = os.environ.get(f"AIRFLOW__{section.upper()}__{key.upper()}")
    if value is None and "airflow.configuration" in sys.modules:
        from airflow.configuration import conf

        value = str(conf.get(section, key, fallback="") or "")
    return value or ""


def _base_url() -> str | None:
    """Airflow's ``[api] base_url``, where the task logs are; ``None`` when not configured."""
    return _option("api", "base_url").strip() or None


def _epoch(view: EpochView) -> str:
    return epoch_text(view.epoch, view.interval_start, view.interval_end, view.logical_date)


def _log(failure: FailureView | HistoryView) -> str:
    """The failed task's log: its link, or where to find it by hand (no ``[api] base_url``)."""
    if failure.log_url:
        return failure.log_url
    parts = (("DAG", failure.dag_id), ("run", failure.run_id), ("task", failure.task_id), ("try", failure.try_number))
    return "log in Airflow: " + ", ".join(f"{name} {value}" for name, value in parts if value is not None)


def status_command(ops: SinkOperations, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    sinks = [ops.sink(args.sink)] if args.sink else ops.sinks()
    threshold = stale_runs.threshold_of(_option(CONFIG_SECTION, stale_runs.STALE_RUN_OPTION))
    check = stale_runs.check(ops, threshold, sink_id=args.sink)
    base_url = _base_url() if check.stale else None
    audits = _awaiting_audit(ops, sinks)
    if args.json:
        print_json(
            out,
            {
                "sinks": [s.model_dump(mode="json") for s in sinks],
                **check.model_dump(mode="json", context={"base_url": base_url}),
                # Only where some epoch waits for its audit: every other status stays as it was.
                **({"awaiting_audit": [_audit_dict(v) for v in audits]} if audits else {}),
            },
        )
        return EXIT_OK
    if not sinks:
        out.write("no sinks: nothing is registered and no epoch was persisted in this meta store\n")
        return EXIT_OK
    rows = [
        (
            s.sink_id,
            s.kind or "(unregistered)",
            ", ".join(s.tables) if s.tables else (s.root or ""),
            s.pending,
            s.committed,
            s.aborted,
            s.reserved,
            "" if s.oldest_pending_created_at is None else s.oldest_pending_created_at.isoformat(timespec="seconds"),
            s.pending_cleanups,
        )
        for s in sinks
    ]
    headers = ["sink", "kind", "tables / root", "pending", "committed", "aborted", "reserved", "oldest pending"]
    table(out, rows, [*headers, "clean-ups queued"])
    if audits:
        out.write("\n" + _audits_text(audits) + "\n")
    for stale in check.stale:
        out.write("\n" + _stale_text(stale, base_url) + "\n")
    if check.not_checked:
        out.write(f"\nruns not checked: {check.not_checked}\n")
    return EXIT_OK


def _awaiting_audit(ops: SinkOperations, sinks: Sequence[SinkSummary]) -> list[EpochView]:
    """The Pending epochs of ``sinks`` whose audited write waits for its audit (design.md D23): its
    checks to run (``Auditing``), an operator (``Audit failed``) or its publish (``Audited``)."""
    found: list[EpochView] = []
    for sink in sinks:
        if sink.pending:
            pending = ops.epochs(sink_id=sink.sink_id, status=EpochStatus.PENDING, limit=MAX_PAGE)
            found += sorted((v for v in pending if v.audit is not None and v.audit.waiting), key=lambda v: v.epoch)
    return found


def _audit_dict(view: EpochView) -> dict[str, Any]:
    return {"sink_id": view.sink_id, "epoch": view.epoch, "stage": view.stage}


def _audits_text(audits: Sequence[EpochView]) -> str:
    """Per sink, its epochs waiting for an audit, counted and named by stage."""
    lines = []
    for sink_id in dict.fromkeys(v.sink_id for v in audits):
        ours = [v for v in audits if v.sink_id == sink_id]
        by_stage = {stage: [v for v in ours if v.stage == stage] for stage in AuditStage}
        counts = ", ".join(f"{len(views)} {stage}" for stage, views in by_stage.items() if views)
        lines.append(f"sink {sink_id}: {len(ours)} epoch(s) wait for an audit ({counts})")
        for stage, views in by_stage.items():
            if views:
                lines.append(f"  {stage}: " + ", ".join(_epoch(v) for v in views))
        if by_stage[AuditStage.AUDIT_FAILED]:
            lines.append(
                f"  an epoch whose audit failed holds until its run is reprocessed or it is rejected: "
                f"eo-sink show {sink_id} EPOCH, then eo-sink reject {sink_id} EPOCH --reason ..."
            )
    return "\n".join(lines)


def _stale_text(stale: StaleRunView, base_url: str | None) -> str:
    """A run that will never finish, and the commands that settle it, one to a line."""
    when = epoch_text(stale.epoch, stale.interval_start, stale.interval_end, stale.logical_date)
    idle = "no task of it ever did anything" if stale.last_activity is None else f"idle for {age(stale.idle_seconds)}"
    lines = [
        f"warning: sink {stale.sink_id} epoch {when} ({stale.status}): run {stale.run_id} of DAG {stale.dag_id} is "
        f"'{stale.run_state}' in Airflow with no live task, {idle}: it will never finish by itself.",
        "  fail the run: the Airflow UI's 'Mark as failed' on the run, or",
        f"    {stale.fail_request(base_url)}",
    ]
    if stale.then is not None:
        lines += [f"  then, as {stale.holds_back}:", f"    {stale.then}"]
    return "\n".join(lines)


def epochs_command(ops: SinkOperations, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    views = ops.epochs(sink_id=args.sink, status=args.status, limit=args.limit, offset=args.offset)
    if args.json:
        print_json(
            out, {"epochs": [v.model_dump(mode="json") for v in views], "limit": args.limit, "offset": args.offset}
        )
        return EXIT_OK
    rows = [
        (
            v.sink_id,
            _epoch(v),
            interval(v.interval_start, v.interval_end),
            v.status if v.stage == v.status else f"{v.status} ({v.stage})",
            "decided" if v.commit_decided_at and v.status == EpochStatus.PENDING.value else "",
            f"{v.files} {v.files_state}" if v.status == EpochStatus.ABORTED.value and v.files else v.files,
            v.rows,
            age(v.age_seconds),
            v.dag_id or "",
            v.run_id or "",
            instant(v.logical_date),
            "unreadable (below)" if v.unreadable else short(v.error, 40),
        )
        for v in views
    ]
    headers = ["sink", "epoch", "data interval", "status", "commit", "files", "rows", "age", "dag", "run"]
    table(out, rows, [*headers, "logical date", "error"])
    for v in views:
        if v.unreadable:
            out.write(f"sink {v.sink_id} epoch {v.epoch} is unreadable: {v.unreadable}\n")
    if len(views) == args.limit:
        out.write(f"(more may follow: --offset {args.offset + args.limit})\n")
    return EXIT_OK


def history_command(ops: SinkOperations, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    base_url = _base_url()
    events = [e.linked(base_url) for e in ops.history(args.sink, args.epoch)]
    if args.json:
        print_json(
            out, {"sink_id": args.sink, "epoch": args.epoch, "history": [e.model_dump(mode="json") for e in events]}
        )
        return EXIT_OK
    view = ops.epoch(args.sink, args.epoch)
    out.write(f"sink {args.sink} epoch {_epoch(view)} ({interval(view.interval_start, view.interval_end)})\n")
    rows = [
        (
            instant(e.at),
            e.event,
            e.status or "",
            e.write_id[:8],
            "" if e.revision is None else e.revision,
            " ".join(str(p) for p in (e.run_id, e.try_number and f"try {e.try_number}") if p),
            ", ".join(p for p in (e.run_type, e.clear_number and f"cleared {e.clear_number}x") if p),
            f"{e.actor} {e.actor_name or ''}".strip(),
            short(e.step or e.reason),
        )
        for e in events
    ]
    table(out, rows, ["at", "event", "status", "write", "rev", "run", "started", "by", "reason"])
    failures = [e for e in events if e.step]
    if failures:
        out.write("\nfailed tasks:\n")
        for e in failures:
            out.write(f"  {instant(e.at)} {e.step}\n    {_log(e)}\n")
    return EXIT_OK


def show_command(ops: SinkOperations, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    view = ops.epoch(args.sink, args.epoch).linked(_base_url())
    try:
        found = ops.checkpoint(args.sink, args.epoch)
        checkpoint: dict[str, Any] = found.model_dump(mode="json")
    except ExactlyOnceError as exc:  # an unregistered sink: its checkpoint source is not known here
        checkpoint = {"status": None, "detail": mask_userinfo(f"{type(exc).__name__}: {exc}"), "source": None}
    delivery = ops.delivery(args.sink)
    if args.json:
        print_json(
            out,
            {
                "epoch": view.model_dump(mode="json"),
                "checkpoint": checkpoint,
                "delivery": delivery.model_dump(mode="json"),
            },
        )
        return EXIT_OK
    data = {
        **view.model_dump(mode="json"),
        "age": age(view.age_seconds),
        "delivery": delivery.text,
        "epoch": _epoch(view),
    }
    data["checkpoint"] = (
        f"{checkpoint['status']} ({checkpoint['meaning']})"
        if checkpoint.get("meaning")
        else checkpoint["status"] or f"unknown ({checkpoint['detail']})"
    )
    data["data_interval"] = interval(view.interval_start, view.interval_end)
    data["logical_date"] = instant(view.logical_date)
    data["log"] = None if view.cause is None else _log(view.cause)
    reservation = view.reservation
    if reservation is not None:
        data["reserved"] = (
            f"position {reservation.position} by run {reservation.run_id or '(unknown)'} at {instant(reservation.reserved_at)}"
        )
        data["range_read_again"] = reservation.read_again
    audit = view.audit
    audited: tuple[str, ...] = ()
    if audit is not None:  # design.md D23: the audit's stage, branch, snapshots and verdict
        data["stage"] = audit.stage
        data["audit_branch"] = audit.branch
        data["audit_snapshots"] = ", ".join(f"{t} -> {s}" for t, s in sorted(audit.snapshots.items()))
        data["audit_verdict"] = audit.verdict or "not judged yet"
        audited = ("stage", "audit_branch", "audit_snapshots", "audit_verdict")
    shown = (
        *("sink_id", "epoch", "data_interval", "status", *audited, "unreadable", "write_id", "dag_id", "run_id"),
        *("logical_date", "try_number", "created_at", "age", "updated_at", "commit_decided_at", "checkpoint"),
        *("delivery", "files", "files_state", "rows", "bytes", "pending_cleanups", "revision", "replacing_write_id"),
        *("error", "log", "warning", "consumed", "reserved", "range_read_again"),
    )
    table(out, [(key, "" if data.get(key) is None else data[key]) for key in shown], ["field", "value"])
    if audit is not None and audit.failed:
        out.write("\n")
        table(out, [(c["name"], c["message"]) for c in audit.failed], ["failed check", "message"])
    out.write("\n")
    table(
        out,
        [(t.name, t.files, t.rows, t.bytes, t.snapshot or "", t.table_uuid or "") for t in view.tables],
        ["table", "files", "rows", "bytes", "snapshot", "table uuid"],
    )
    upserts = [t for t in view.tables if t.changes is not None]
    if upserts:
        out.write("\n")
        table(
            out,
            [
                (t.name, *(t.changes[k] for k in ("inserted", "updated", "deleted", "files_rewritten")))  # type: ignore[index]
                for t in upserts
            ],
            ["table", "inserted", "updated", "deleted", "files rewritten"],
        )
    if view.revisions:
        out.write("\n")
        table(
            out,
            [
                (
                    r.revision,
                    r.status,
                    r.write_id,
                    r.generation or "",
                    r.run_id or "",
                    instant(r.logical_date),
                    r.try_number or "",
                    r.rows,
                    ", ".join(f"{t} -> {s}" for t, s in sorted((r.committed or {}).items())),
                    r.reason or "",
                )
                for r in view.revisions
            ],
            ["revision", "status", "write", "generation", "run", "logical date", "try", "rows", "snapshots", "reason"],
        )
    return EXIT_OK
