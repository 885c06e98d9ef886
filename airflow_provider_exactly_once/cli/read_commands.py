"""``eo-sink``'s read commands: ``status``, ``epochs``, ``history`` and ``show``; each reads the meta
store (``show`` also the sink's catalog for ``delivery``) and changes nothing."""

from __future__ import annotations

import argparse
from typing import Any, TextIO

from airflow_provider_exactly_once.cli.output import EXIT_OK, age, instant, interval, print_json, short, table
from airflow_provider_exactly_once.core.errors import ExactlyOnceError
from airflow_provider_exactly_once.core.redact import mask_userinfo
from airflow_provider_exactly_once.core.status import EpochStatus
from airflow_provider_exactly_once.operations import SinkOperations


def status_command(ops: SinkOperations, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    sinks = [ops.sink(args.sink)] if args.sink else ops.sinks()
    if args.json:
        print_json(out, {"sinks": [s.to_dict() for s in sinks]})
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
            "" if s.oldest_pending_created_at is None else s.oldest_pending_created_at.isoformat(timespec="seconds"),
            s.pending_cleanups,
        )
        for s in sinks
    ]
    table(
        out,
        rows,
        ["sink", "kind", "tables / root", "pending", "committed", "aborted", "oldest pending", "clean-ups queued"],
    )
    return EXIT_OK


def epochs_command(ops: SinkOperations, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    views = ops.epochs(sink_id=args.sink, status=args.status, limit=args.limit, offset=args.offset)
    if args.json:
        print_json(out, {"epochs": [v.to_dict() for v in views], "limit": args.limit, "offset": args.offset})
        return EXIT_OK
    rows = [
        (
            v.sink_id,
            v.epoch,
            interval(v.interval_start, v.interval_end),
            v.status,
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
    events = ops.history(args.sink, args.epoch)
    if args.json:
        print_json(out, {"sink_id": args.sink, "epoch": args.epoch, "history": [e.to_dict() for e in events]})
        return EXIT_OK
    view = ops.epoch(args.sink, args.epoch)
    out.write(f"sink {args.sink} epoch {args.epoch} ({interval(view.interval_start, view.interval_end)})\n")
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
            short(e.reason),
        )
        for e in events
    ]
    table(out, rows, ["at", "event", "status", "write", "rev", "run", "started", "by", "reason"])
    return EXIT_OK


def show_command(ops: SinkOperations, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    view = ops.epoch(args.sink, args.epoch)
    try:
        checkpoint: dict[str, Any] = ops.checkpoint(args.sink, args.epoch).to_dict()
    except ExactlyOnceError as exc:  # an unregistered sink: its checkpoint source is not known here
        checkpoint = {"status": None, "detail": mask_userinfo(f"{type(exc).__name__}: {exc}"), "source": None}
    delivery = ops.delivery(args.sink)
    if args.json:
        print_json(out, {"epoch": view.to_dict(), "checkpoint": checkpoint, "delivery": delivery.to_dict()})
        return EXIT_OK
    data = {**view.to_dict(), "age": age(view.age_seconds), "delivery": delivery.text}
    data["checkpoint"] = checkpoint["status"] or f"unknown ({checkpoint['detail']})"
    data["data_interval"] = interval(view.interval_start, view.interval_end)
    data["logical_date"] = instant(view.logical_date)
    shown = (
        *("sink_id", "epoch", "data_interval", "status", "unreadable", "write_id", "dag_id", "run_id", "logical_date"),
        *("try_number", "created_at", "age", "updated_at", "commit_decided_at", "checkpoint", "delivery"),
        *("files", "files_state", "rows", "bytes", "pending_cleanups", "revision", "replacing_write_id", "error"),
        "warning",
        "consumed",
    )
    table(out, [(key, "" if data[key] is None else data[key]) for key in shown], ["field", "value"])
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
