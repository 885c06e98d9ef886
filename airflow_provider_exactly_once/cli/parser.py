"""``eo-sink``'s command line in and out: its commands, options and argument types, each checked where
argparse turns a refusal into a usage error naming it, and how it answers: exit codes, JSON for
scripts, plain tables for people, instants as the tasks log them. Everything it echoes or prints is
masked and made safe for a terminal (``core.errors``; docs/cli.md).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn, TextIO

from airflow_provider_exactly_once.core.epochs import (
    ABORT_REASON_MAX_LENGTH,
    EPOCH_MAX,
    EpochStatus,
    abort_reason_fault,
    check_epoch,
    check_sink_id,
)
from airflow_provider_exactly_once.core.errors import InvalidPreCommit, find_control, mask_userinfo, safe_text
from airflow_provider_exactly_once.defaults import DEFAULT_META_CONN_ID
from airflow_provider_exactly_once.runtime.run_epochs import instant_text, interval_text

__all__ = [
    "EXIT_BUSY",
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_USAGE",
    "MAX_DURATION",
    "age",
    "bounded",
    "build_parser",
    "duration",
    "echoed",
    "epoch_text",
    "instant",
    "interval",
    "print_json",
    "short",
    "table",
]

# ``eo-sink``'s command line: its commands, options and argument types.
#
# Every argument is checked here, where argparse turns a refusal into a usage error (exit 2) naming
# the argument: an epoch or offset past a signed 64-bit column, a duration past what ``timedelta``
# holds, a sink id with characters unsafe in a path, an abort reason longer than a row keeps.
# argparse quotes the argument it refuses, so its message is masked and escaped like every other
# (``core.errors``): a meta-store URL typed where a command belongs must not put its password on the
# terminal. A refused argument is echoed as a bounded prefix (``echoed``), whatever its length.

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
#: The longest duration taken: far beyond any grace period, and well inside what ``timedelta`` holds.
MAX_DURATION = timedelta(days=36_500)
#: The longest Airflow connection id (Airflow's ``connection.conn_id`` column).
CONN_ID_MAX_LENGTH = 250
#: How much of an argument a message echoes: enough to recognise it, never a pasted file.
ECHOED_MAX_LENGTH = 80
#: A run of characters no path or name in a message reaches: an argument echoed whole (by argparse,
#: by a library quoting the URL it was given), longer than any ``echoed`` one, even escaped.
_LONG_TOKEN = re.compile(r"\S{401,}")


def echoed(text: str) -> str:
    """``text`` as a message quotes it: masked, then cut to a bounded prefix that says how long it was."""
    text = mask_userinfo(text)
    if len(text) <= ECHOED_MAX_LENGTH:
        return repr(text)
    return f"{text[:ECHOED_MAX_LENGTH]!r}... ({len(text)} characters)"


def bounded(message: str) -> str:
    """A message for the terminal, masked and with every run of characters too long for anything but
    an argument echoed whole cut to a prefix; masked before it is cut, as a cut URL would no longer
    show where its password ends."""
    return _LONG_TOKEN.sub(lambda m: f"{m[0][:ECHOED_MAX_LENGTH]}... ({len(m[0])} characters)", mask_userinfo(message))


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
                f"{echoed(text)} is not a duration (e.g. 6h, 30m, 1h30m, 2d, or seconds)"
            ) from None
        seconds = sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)
    if math.isnan(seconds) or seconds < 0:
        raise argparse.ArgumentTypeError(f"duration {echoed(text)} is negative or not a number")
    if seconds > MAX_DURATION.total_seconds():
        raise argparse.ArgumentTypeError(f"duration {echoed(text)} is longer than {MAX_DURATION.days} days")
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
        raise argparse.ArgumentTypeError(f"epoch {echoed(text)} is not a non-negative integer") from None


def _conn_id(text: str) -> str:
    """An Airflow connection id: one that could exist (Airflow keeps at most 250 characters)."""
    if not text.strip() or len(text) > CONN_ID_MAX_LENGTH or find_control(text) is not None:
        raise argparse.ArgumentTypeError(
            f"{echoed(text)} cannot name an Airflow connection: give an id of 1 to {CONN_ID_MAX_LENGTH} printable "
            "characters, or leave the option out for the configured one"
        )
    return text


def _status(text: str) -> str:
    for status in (*(s.value for s in EpochStatus), "Reserved"):  # Reserved: a range reserved, no row yet
        if text.strip().lower() == status.lower():
            return status
    raise argparse.ArgumentTypeError(
        f"status {echoed(text)} is not one of {[*(s.value for s in EpochStatus), 'Reserved']}"
    )


def _reason(text: str) -> str:
    if (fault := abort_reason_fault(text)) is not None:
        raise argparse.ArgumentTypeError(fault)
    return text


def _page_size(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 1000:
        raise argparse.ArgumentTypeError(f"limit {echoed(text)} must be an integer from 1 to 1000")
    return value


def _offset(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= EPOCH_MAX:
        raise argparse.ArgumentTypeError(f"offset {echoed(text)} must be an integer from 0 to {EPOCH_MAX}")
    return value


# -- the parser --------------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """argparse's parser, its usage errors masked, escaped and their echoes of arguments bounded
    (the subcommands' parsers are this class too): argparse quotes an unknown command or argument whole."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(2, safe_text(f"{self.prog}: error: {bounded(message)}") + "\n")


def build_parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    where = common.add_mutually_exclusive_group()
    where.add_argument(
        "--meta-conn-id",
        type=_conn_id,
        help="the exactly_once_meta Airflow connection of the meta store, asked of Airflow (default: "
        f"EO_SINK_URL if set, else the provider's [exactly_once] meta_conn_id, else {DEFAULT_META_CONN_ID}), "
        "as the tasks resolve it",
    )
    where.add_argument(
        "--url", help="a SQLAlchemy URL of the meta store (default: EO_SINK_URL), bypassing Airflow connections"
    )
    common.add_argument("--json", action="store_true", help="print JSON instead of tables")
    common.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="log INFO lines too, on stderr (by default only warnings and errors)",
    )
    dry = _Parser(add_help=False)
    dry.add_argument("--dry-run", action="store_true", help="say what would happen; change nothing")

    parser = _Parser(
        prog="eo-sink",
        description="Inspect exactly-once sinks and act on their epochs (through the two-phase-commit coordinator).",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    status = commands.add_parser("status", parents=[common], help="sinks and their epoch counts by status")
    status.add_argument("sink", nargs="?", type=_sink_id, help="only this sink")

    epochs = commands.add_parser("epochs", parents=[common], help="list epochs, newest first")
    epochs.add_argument("sink", nargs="?", type=_sink_id, help="only this sink")
    epochs.add_argument("--status", type=_status, help="Pending, Committed, Aborted or Reserved")
    epochs.add_argument("--limit", type=_page_size, default=50, help="rows per page (default 50, at most 1000)")
    epochs.add_argument("--offset", type=_offset, default=0, help="rows to skip (default 0)")

    show = commands.add_parser(
        "show", parents=[common], help="one epoch: its row, write, checkpoint, and how its tables are committed"
    )
    show.add_argument("sink", type=_sink_id)
    show.add_argument("epoch", type=_epoch)

    history = commands.add_parser(
        "history", parents=[common], help="one epoch's history: every persist, decision, commit, abort and clean-up"
    )
    history.add_argument("sink", type=_sink_id)
    history.add_argument("epoch", type=_epoch)

    abort = commands.add_parser("abort", parents=[common, dry], help="abort a Pending epoch and delete its files")
    abort.add_argument("sink", type=_sink_id)
    abort.add_argument("epoch", type=_epoch)
    abort.add_argument(
        "--reason",
        required=True,
        type=_reason,
        help=f"why: one line, at most {ABORT_REASON_MAX_LENGTH} characters; kept on the epoch's row",
    )
    abort.add_argument(
        "--force", action="store_true", help="abort even though the checkpoint COMPLETED (drops its data on purpose)"
    )
    abort.add_argument(
        "--files-lost",
        action="store_true",
        help="give up a write whose data files are gone for good, even after its commit was decided; refused "
        "while every file exists or a table shows the epoch",
    )

    reject = commands.add_parser(
        "reject", parents=[common, dry], help="drop an audited epoch whose audit failed, and delete its files"
    )
    reject.add_argument("sink", type=_sink_id)
    reject.add_argument("epoch", type=_epoch)
    reject.add_argument(
        "--reason",
        required=True,
        type=_reason,
        help=f"why: one line, at most {ABORT_REASON_MAX_LENGTH} characters; kept on the epoch's row",
    )

    commit = commands.add_parser("commit", parents=[common, dry], help="retry the commit of a Pending epoch")
    commit.add_argument("sink", type=_sink_id)
    commit.add_argument("epoch", type=_epoch)
    commit.add_argument(
        "--beyond-horizon",
        action="store_true",
        help="commit an epoch older than the table's snapshot history (MarkerHorizonExceeded), once you have "
        "read the history and found its rows absent",
    )

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


# How ``eo-sink`` answers: its exit codes, JSON for scripts, plain tables for people, instants and
# intervals as the tasks log them; every cell made safe to print (``core.errors``: text read back from
# the meta store may carry terminal controls).

#: 0 done, 1 refused or failed, 2 bad usage (argparse's convention), 3 busy (another holds the sink).
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_BUSY = 0, 1, 2, 3


def print_json(out: TextIO, value: Any) -> None:
    out.write(json.dumps(value, indent=2, sort_keys=True) + "\n")


def table(out: TextIO, rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> None:
    from tabulate import tabulate  # type: ignore[import-untyped]  # no stubs; plain text tables

    shown = [[safe_text(str(cell)) for cell in row] for row in rows]
    out.write(tabulate(shown, headers=headers, tablefmt="simple", disable_numparse=True) + "\n")


def age(seconds: float | None) -> str:
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


def instant(at: datetime | None) -> str:
    return "" if at is None else instant_text(at)


def interval(start: datetime | None, end: datetime | None) -> str:
    """As the tasks log it; the end is ``...`` when the store has no record of the run."""
    return "" if start is None else interval_text(start, end)


#: Before this instant an epoch number is no date a run had (an allocated or custom epoch): the
#: number alone is shown.
_DATED_FROM = datetime(2000, 1, 1, tzinfo=UTC)


def epoch_text(epoch: int, start: datetime | None, end: datetime | None, logical: datetime | None) -> str:
    """``2026-01-01T00:00Z (1767225600000)``: an epoch as a date with its id beside, the date its
    run's data interval starts, else its run's logical date (a manual run has no interval), else,
    without a record of its run, the instant the number stands for (none for a small number)."""
    when = start if end is not None else logical or start
    if when is None or (end is None and logical is None and when < _DATED_FROM):
        return str(epoch)
    return f"{instant_text(when)} ({epoch})"


def short(text: str | None, width: int = 60) -> str:
    if not text:
        return ""
    line = text.splitlines()[0]
    return line if len(line) <= width else line[: width - 1] + "…"
