"""``eo-sink``: look at the exactly-once sinks and act on their epochs from a shell.

A thin shell over ``operations.SinkOperations``, the service the Airflow UI's sink view calls too:
every action goes through the sink's coordinator, under the same invariants as the DAG's tasks.

Exit codes: 0 done (or, with ``--dry-run``, it would be done); 1 a refusal or a failure, with the
message on stderr naming the sink and epoch; 2 bad usage (argparse's own convention).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import re
import sys
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, NoReturn, TextIO

from airflow_provider_exactly_once.core.errors import ExactlyOnceError, InvalidPreCommit, InvalidSinkConfig
from airflow_provider_exactly_once.core.identifiers import check_epoch, check_sink_id
from airflow_provider_exactly_once.core.status import EpochStatus
from airflow_provider_exactly_once.operations import ActionResult, InvalidRequest, SinkOperations
from airflow_provider_exactly_once.operations.service import DEFAULT_META_CONN_ID
from airflow_provider_exactly_once.store import SqlSinkStateStore

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


# -- argument types ----------------------------------------------------------------------------------


def duration(text: str) -> timedelta:
    """``6h``, ``30m``, ``1h30m``, ``2d``, ``90s``, or plain seconds."""
    value = text.strip().lower()
    try:
        seconds = float(value)
    except ValueError:
        parts = _DURATION.findall(value)
        if not parts or "".join(n + u for n, u in parts) != value:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a duration (e.g. 6h, 30m, 1h30m, 2d, or seconds)"
            ) from None
        seconds = sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)
    if seconds < 0:
        raise argparse.ArgumentTypeError(f"duration {text!r} is negative")
    return timedelta(seconds=seconds)


def _sink_id(text: str) -> str:
    try:
        return check_sink_id(text)
    except InvalidPreCommit as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _epoch(text: str) -> int:
    try:
        return check_epoch(int(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"epoch {text!r} is not a non-negative integer") from None


def _status(text: str) -> EpochStatus:
    for status in EpochStatus:
        if text.strip().lower() == status.value.lower():
            return status
    raise argparse.ArgumentTypeError(f"status {text!r} is not one of {[s.value for s in EpochStatus]}")


def _page_size(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 1000:
        raise argparse.ArgumentTypeError(f"limit {text!r} must be an integer from 1 to 1000")
    return value


def _offset(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"offset {text!r} must be a non-negative integer")
    return value


# -- the parser --------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    where = common.add_mutually_exclusive_group()
    where.add_argument(
        "--meta-conn-id",
        default=DEFAULT_META_CONN_ID,
        help=f"the exactly_once_meta Airflow connection of the meta store (default {DEFAULT_META_CONN_ID})",
    )
    where.add_argument("--url", help="a SQLAlchemy URL of the meta store, bypassing Airflow connections")
    common.add_argument("--json", action="store_true", help="print JSON instead of tables")
    dry = argparse.ArgumentParser(add_help=False)
    dry.add_argument("--dry-run", action="store_true", help="say what would happen; change nothing")

    parser = argparse.ArgumentParser(
        prog="eo-sink",
        description="Inspect exactly-once sinks and act on their epochs (through the two-phase-commit coordinator).",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    status = commands.add_parser("status", parents=[common], help="sinks and their epoch counts by status")
    status.add_argument("sink", nargs="?", type=_sink_id, help="only this sink")

    epochs = commands.add_parser("epochs", parents=[common], help="list epochs, newest first")
    epochs.add_argument("sink", nargs="?", type=_sink_id, help="only this sink")
    epochs.add_argument("--status", type=_status, help="Pending, Committed or Aborted")
    epochs.add_argument("--limit", type=_page_size, default=50, help="rows per page (default 50, at most 1000)")
    epochs.add_argument("--offset", type=_offset, default=0, help="rows to skip (default 0)")

    show = commands.add_parser("show", parents=[common], help="one epoch: its row, write and checkpoint")
    show.add_argument("sink", type=_sink_id)
    show.add_argument("epoch", type=_epoch)

    abort = commands.add_parser("abort", parents=[common, dry], help="abort a Pending epoch and delete its files")
    abort.add_argument("sink", type=_sink_id)
    abort.add_argument("epoch", type=_epoch)
    abort.add_argument("--reason", required=True, help="why; kept on the epoch's row")
    abort.add_argument(
        "--force", action="store_true", help="abort even though the checkpoint COMPLETED (drops its data on purpose)"
    )

    commit = commands.add_parser("commit", parents=[common, dry], help="retry the commit of a Pending epoch")
    commit.add_argument("sink", type=_sink_id)
    commit.add_argument("epoch", type=_epoch)

    cleanup = commands.add_parser(
        "cleanup", parents=[common, dry], help="run an epoch's queued clean-ups again (e.g. an Aborted one's files)"
    )
    cleanup.add_argument("sink", type=_sink_id)
    cleanup.add_argument("epoch", type=_epoch)

    recover = commands.add_parser(
        "recover", parents=[common, dry], help="what the recovery DAG does, for one sink or every registered one"
    )
    recover.add_argument("sink", nargs="?", type=_sink_id)

    gc = commands.add_parser("gc", parents=[common, dry], help="remove orphaned write locations older than --grace")
    gc.add_argument("sink", nargs="?", type=_sink_id)
    gc.add_argument("--grace", type=duration, default=timedelta(hours=6), help="minimum file age (default 6h)")
    return parser


# -- running -----------------------------------------------------------------------------------------


def _open_store(args: argparse.Namespace) -> SqlSinkStateStore:
    if args.url:
        return SqlSinkStateStore(args.url)
    from airflow_provider_exactly_once.hooks.meta_store import ExactlyOnceMetaStoreHook

    return ExactlyOnceMetaStoreHook(args.meta_conn_id).get_store()


def main(argv: Sequence[str] | None = None, *, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse printed the usage error (2) or the help (0)
        return int(exc.code or 0) if not isinstance(exc.code, str) else EXIT_USAGE
    # Library logs (the meta-store hook, pyiceberg) go to stderr, never into a table or JSON on stdout.
    logging.basicConfig(stream=err, level=logging.WARNING, force=True)
    target = _target(args)
    try:
        with contextlib.redirect_stdout(err):  # the meta-store hook imports Airflow (see below)
            store = _open_store(args)
    except InvalidSinkConfig as exc:  # a malformed URL or a connection that cannot name a store
        print(f"eo-sink {args.command}: {exc}", file=err)
        return EXIT_USAGE
    except ExactlyOnceError as exc:
        return _fail(args, err, out, exc, "(opening the meta store)")
    try:
        # Airflow, imported only when an action rebuilds a sink's coordinator, sets up its own logging
        # to whatever ``sys.stdout`` is then: point that at stderr so stdout holds only our output.
        with contextlib.redirect_stdout(err):
            return COMMANDS[args.command](SinkOperations(store, meta_conn_id=args.meta_conn_id), args, out, err)
    except InvalidRequest as exc:
        print(f"eo-sink {args.command} {target}: {exc}", file=err)
        return EXIT_USAGE
    except ExactlyOnceError as exc:
        return _fail(args, err, out, exc, target)
    finally:
        store.dispose()


def run() -> NoReturn:
    """The ``eo-sink`` console script."""
    sys.exit(main())


def _target(args: argparse.Namespace) -> str:
    sink = getattr(args, "sink", None)
    epoch = getattr(args, "epoch", None)
    if sink is None:
        return "(all sinks)"
    return f"sink {sink!r}" + ("" if epoch is None else f" epoch {epoch}")


def _fail(args: argparse.Namespace, err: TextIO, out: TextIO, exc: ExactlyOnceError, target: str) -> int:
    """One line on stderr naming what was acted on and the refusal; with ``--json`` also a JSON object."""
    print(f"eo-sink {args.command} {target}: {type(exc).__name__}: {exc}", file=err)
    if args.json:
        _print_json(
            out,
            {
                "error": type(exc).__name__,
                "message": str(exc),
                "retryable": exc.retryable,
                "sink_id": getattr(args, "sink", None),
                "epoch": getattr(args, "epoch", None),
            },
        )
    return EXIT_FAILED


def _print_json(out: TextIO, value: Any) -> None:
    out.write(json.dumps(value, indent=2, sort_keys=True) + "\n")


def _table(out: TextIO, rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> None:
    from tabulate import tabulate  # type: ignore[import-untyped]  # no stubs; plain text tables

    out.write(tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True) + "\n")


def _age(seconds: float | None) -> str:
    if seconds is None:
        return ""
    minutes, _ = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    if days:
        return f"{days}d{hours}h"
    if hours:
        return f"{hours}h{minutes}m"
    return f"{minutes}m" if minutes else f"{int(seconds)}s"


def _short(text: str | None, width: int = 60) -> str:
    if not text:
        return ""
    line = text.splitlines()[0]
    return line if len(line) <= width else line[: width - 1] + "…"


# -- commands ----------------------------------------------------------------------------------------


def _status_command(ops: SinkOperations, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    sinks = [ops.sink(args.sink)] if args.sink else ops.sinks()
    if args.json:
        _print_json(out, {"sinks": [s.to_dict() for s in sinks]})
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
    _table(
        out,
        rows,
        ["sink", "kind", "tables / root", "pending", "committed", "aborted", "oldest pending", "clean-ups queued"],
    )
    return EXIT_OK


def _epochs_command(ops: SinkOperations, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    views = ops.epochs(sink_id=args.sink, status=args.status, limit=args.limit, offset=args.offset)
    if args.json:
        _print_json(out, {"epochs": [v.to_dict() for v in views], "limit": args.limit, "offset": args.offset})
        return EXIT_OK
    rows = [
        (
            v.sink_id,
            v.epoch,
            v.status,
            "decided" if v.commit_decided_at and v.status == EpochStatus.PENDING.value else "",
            v.files,
            v.rows,
            _age(v.age_seconds),
            v.dag_id or "",
            v.run_id or "",
            _short(v.error, 40),
        )
        for v in views
    ]
    _table(out, rows, ["sink", "epoch", "status", "commit", "files", "rows", "age", "dag", "run", "error"])
    if len(views) == args.limit:
        out.write(f"(more may follow: --offset {args.offset + args.limit})\n")
    return EXIT_OK


def _show_command(ops: SinkOperations, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    view = ops.epoch(args.sink, args.epoch)
    try:
        checkpoint: dict[str, Any] = ops.checkpoint(args.sink, args.epoch).to_dict()
    except ExactlyOnceError as exc:  # an unregistered sink: its checkpoint source is not known here
        checkpoint = {"status": None, "detail": f"{type(exc).__name__}: {exc}", "source": None}
    if args.json:
        _print_json(out, {"epoch": view.to_dict(), "checkpoint": checkpoint})
        return EXIT_OK
    data = {**view.to_dict(), "age": _age(view.age_seconds)}
    data["checkpoint"] = checkpoint["status"] or f"unknown ({checkpoint['detail']})"
    shown = (
        "sink_id",
        "epoch",
        "interval_start",
        "status",
        "write_id",
        "dag_id",
        "run_id",
        "try_number",
        "created_at",
        "age",
        "updated_at",
        "commit_decided_at",
        "checkpoint",
        "files",
        "rows",
        "bytes",
        "pending_cleanups",
        "error",
    )
    _table(out, [(key, "" if data[key] is None else data[key]) for key in shown], ["field", "value"])
    out.write("\n")
    _table(
        out,
        [(t.name, t.files, t.rows, t.bytes, t.snapshot or "") for t in view.tables],
        ["table", "files", "rows", "bytes", "snapshot"],
    )
    return EXIT_OK


def _print_result(out: TextIO, args: argparse.Namespace, result: ActionResult) -> int:
    if args.json:
        _print_json(out, result.to_dict())
    else:
        where = f"sink {result.sink_id!r}" + ("" if result.epoch is None else f" epoch {result.epoch}")
        prefix = "[dry run] " if result.dry_run else ""
        out.write(f"{prefix}{result.action} {where}: {result.outcome}\n  {result.detail}\n")
    return EXIT_OK if result.ok else EXIT_FAILED


def _abort_command(ops: SinkOperations, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    result = ops.abort(args.sink, args.epoch, reason=args.reason, force=args.force, dry_run=args.dry_run)
    return _print_result(out, args, result)


def _commit_command(ops: SinkOperations, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    return _print_result(out, args, ops.commit(args.sink, args.epoch, dry_run=args.dry_run))


def _cleanup_command(ops: SinkOperations, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    return _print_result(out, args, ops.cleanup(args.sink, args.epoch, dry_run=args.dry_run))


def _per_sink(
    ops: SinkOperations,
    args: argparse.Namespace,
    out: TextIO,
    err: TextIO,
    act: Callable[[str], ActionResult],
) -> int:
    """One sink, or each registered sink in turn: one sink's failure does not stop the others."""
    if args.sink:
        return _print_result(out, args, act(args.sink))
    sink_ids = [s.sink_id for s in ops.sinks() if s.registered]
    results: list[dict[str, Any]] = []
    code = EXIT_OK
    for sink_id in sink_ids:
        try:
            result = act(sink_id)
        except ExactlyOnceError as exc:
            print(f"eo-sink {args.command} sink {sink_id!r}: {type(exc).__name__}: {exc}", file=err)
            results.append({"sink_id": sink_id, "error": type(exc).__name__, "message": str(exc)})
            code = EXIT_FAILED
            continue
        if not result.ok:
            code = EXIT_FAILED
        if args.json:
            results.append(result.to_dict())
        else:
            _print_result(out, args, result)
    if args.json:
        _print_json(out, {"results": results})
    elif not sink_ids:
        out.write("no registered sinks\n")
    return code


def _recover_command(ops: SinkOperations, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    return _per_sink(ops, args, out, err, lambda sink_id: ops.recover(sink_id, dry_run=args.dry_run))


def _gc_command(ops: SinkOperations, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    return _per_sink(ops, args, out, err, lambda sink_id: ops.gc(sink_id, grace=args.grace, dry_run=args.dry_run))


COMMANDS: dict[str, Callable[[SinkOperations, argparse.Namespace, TextIO, TextIO], int]] = {
    "status": _status_command,
    "epochs": _epochs_command,
    "show": _show_command,
    "abort": _abort_command,
    "commit": _commit_command,
    "cleanup": _cleanup_command,
    "recover": _recover_command,
    "gc": _gc_command,
}

__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_USAGE", "build_parser", "duration", "main", "run"]
