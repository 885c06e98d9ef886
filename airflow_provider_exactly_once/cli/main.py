"""``eo-sink``: look at the exactly-once sinks and act on their epochs from a shell.

A thin shell over ``operations.SinkOperations``, the service the UI's sink view calls too, so every
action goes through the sink's coordinator under the same invariants as the DAG's tasks. Everything
it prints has its secrets masked and control characters escaped (``core.errors``), and an echoed
argument is cut to a bounded prefix. Commands and exit codes: docs/cli.md; the connection: design.md D20.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import logging
import os
import signal
import socket
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn, TextIO

from airflow_provider_exactly_once.cli.parser import (
    EXIT_BUSY,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    bounded,
    build_parser,
    duration,
    echoed,
    print_json,
)
from airflow_provider_exactly_once.cli.read_commands import (
    epochs_command,
    history_command,
    show_command,
    status_command,
)
from airflow_provider_exactly_once.core.epochs import Actor, ActorKind, acting
from airflow_provider_exactly_once.core.errors import (
    ExactlyOnceError,
    InvalidSinkConfig,
    SinkLocked,
    mask_userinfo,
    safe_text,
)
from airflow_provider_exactly_once.defaults import DEFAULT_META_CONN_ID
from airflow_provider_exactly_once.operations import ActionResult, InvalidRequest, SinkOperations
from airflow_provider_exactly_once.store import SqlSinkStateStore
from airflow_provider_exactly_once.upstream_private import as_airflow_server_process

#: Set to ``1`` to see the traceback of an unexpected error (by default one masked line, as for a refusal).
TRACEBACK_ENV = "EO_SINK_TRACEBACK"
#: The exit status when the output's reader has gone (``eo-sink ... | head``): 128 + SIGPIPE, which a
#: shell reports for any tool SIGPIPE ended; 1 would say the command failed, which it did not.
EXIT_READER_GONE = 128 + signal.SIGPIPE
#: The meta store's SQLAlchemy URL when neither ``--url`` nor ``--meta-conn-id`` is given.
URL_ENV = "EO_SINK_URL"
#: Airflow's logging level and its loggers' own levels, read when Airflow is first imported.
AIRFLOW_LOG_LEVEL = "AIRFLOW__LOGGING__LOGGING_LEVEL"
AIRFLOW_NAMESPACE_LEVELS = "AIRFLOW__LOGGING__NAMESPACE_LEVELS"
#: Unless set otherwise: Airflow's ``Connection`` warns, each time it reads one from its database or a
#: secrets backend, that a type with "_" (``exactly_once_meta``) is no URI scheme; its only warning,
#: which asks nothing of whoever runs eo-sink.
_QUIET_AIRFLOW_LOGGERS = "airflow.models.connection.Connection=ERROR"


# -- running -----------------------------------------------------------------------------------------


def _open_store(args: argparse.Namespace) -> SqlSinkStateStore:
    """The store of ``--url`` or ``EO_SINK_URL``, which import nothing of Airflow; else the meta-store
    connection, asked of Airflow as its server processes ask it (docs/design.md, D20)."""
    if args.url is not None:
        return _store_at(args.url, "--url")
    if args.meta_conn_id is None and os.environ.get(URL_ENV):
        return _store_at(os.environ[URL_ENV], URL_ENV)
    from airflow_provider_exactly_once.hooks.meta_store import ExactlyOnceMetaStoreHook
    from airflow_provider_exactly_once.runtime.assembly import meta_conn_id_or_configured

    # The connection the tasks use when a DAG names none, so that eo-sink reads their meta store.
    args.meta_conn_id = meta_conn_id_or_configured(args.meta_conn_id)
    return ExactlyOnceMetaStoreHook(args.meta_conn_id).get_store()


def _store_at(url: str, given_as: str) -> SqlSinkStateStore:
    """The store of ``--url`` or ``EO_SINK_URL`` (``given_as``); a URL that cannot name one is
    ``InvalidSinkConfig`` (a usage error)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    shown = echoed(url)  # masked, and a bounded prefix of a URL however long
    try:
        parsed = make_url(url)
        if parsed.get_backend_name() in ("sqlite", "postgresql"):  # the store refuses the others by name
            parsed.get_dialect().import_dbapi()  # a driver that is not installed is said here, by name
    except (ArgumentError, ValueError) as exc:  # ValueError: a port that is not a number
        raise InvalidSinkConfig(f"{given_as} {shown} is not a SQLAlchemy URL: {mask_userinfo(str(exc))}") from None
    except (ImportError, NoSuchModuleError) as exc:
        raise InvalidSinkConfig(
            f"{given_as} {shown}: the database driver is not installed ({mask_userinfo(str(exc))}); "
            "use postgresql+psycopg2://... or sqlite:///..., or install the driver"
        ) from None
    return SqlSinkStateStore(url)


def main(argv: Sequence[str] | None = None, *, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    try:
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                args = build_parser().parse_args(argv)
        except SystemExit as exc:  # argparse printed the usage error (2) or the help (0)
            code = int(exc.code or 0) if not isinstance(exc.code, str) else EXIT_USAGE
        else:
            with (
                _logging(err, verbose=args.verbose),
                acting(Actor(ActorKind.CLI, name=_user())),
                as_airflow_server_process(),  # connections made in the UI are the CLI's too
            ):
                code = _run(args, out, err)
        out.flush()  # here, not at the interpreter's exit, so that a reader gone is caught below
    except BrokenPipeError:
        return _reader_gone(out)
    return code


def _reader_gone(out: TextIO) -> int:
    """Whoever read the output left before its end (``eo-sink epochs | head``): exit at once, saying
    nothing, with the status a shell gives a tool SIGPIPE ended; what the buffer still holds goes to
    devnull, not to a second BrokenPipeError as the interpreter exits (Python's "Note on SIGPIPE")."""
    with contextlib.suppress(OSError, ValueError):  # an output with no descriptor (tests' StringIO)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, out.fileno())
        os.close(devnull)
    return EXIT_READER_GONE


def _user() -> str:
    """The epochs' history names an ``eo-sink`` action's user and host (``core.epochs``)."""
    try:
        user = getpass.getuser()
    except Exception:  # no passwd entry in some containers
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


@contextlib.contextmanager
def _logging(err: TextIO, *, verbose: bool) -> Iterator[None]:
    """Logs on stderr, never in a table or JSON on stdout; warnings and errors only unless ``--verbose``.

    Airflow sets up its own logging when it is first imported (by the meta-store hook, or to rebuild
    a sink's coordinator), at its configured level, INFO by default: told the level before that, it
    keeps its INFO lines (the embedded meta store's, the migrations') out of a quiet run too, and
    ``Connection``'s warning about this provider's connection type out of every run.
    """
    level = "INFO" if verbose else "WARNING"
    logging.basicConfig(stream=err, level=level, force=True)
    _mask_log_records()
    for name in _SECRETS_MASKER_LOGGERS:
        logging.getLogger(name).addFilter(_drop_short_secret_notice)
    before = {name: os.environ.get(name) for name in (AIRFLOW_LOG_LEVEL, AIRFLOW_NAMESPACE_LEVELS)}
    if "airflow" not in sys.modules:
        os.environ[AIRFLOW_LOG_LEVEL] = level
        os.environ.setdefault(AIRFLOW_NAMESPACE_LEVELS, _QUIET_AIRFLOW_LOGGERS)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    target = _target(args)
    try:
        with contextlib.redirect_stdout(err):  # the meta-store hook imports Airflow (see below)
            store = _open_store(args)
    except InvalidSinkConfig as exc:  # a malformed URL or a connection that cannot name a store
        print(safe_text(bounded(f"eo-sink {args.command}: {exc}")), file=err)
        return EXIT_USAGE
    except ExactlyOnceError as exc:
        return _fail(args, err, out, exc, "(opening the meta store)")
    except Exception as exc:
        return _unexpected(args, err, out, exc, "(opening the meta store)")
    try:
        # Airflow, imported only when an action rebuilds a sink's coordinator, sets up its own logging
        # to whatever ``sys.stdout`` is then: point that at stderr so stdout holds only our output.
        with contextlib.redirect_stdout(err):
            return COMMANDS[args.command](
                SinkOperations(store, meta_conn_id=args.meta_conn_id or DEFAULT_META_CONN_ID), args, out, err
            )
    except InvalidRequest as exc:
        print(safe_text(bounded(f"eo-sink {args.command} {target}: {exc}")), file=err)
        return EXIT_USAGE
    except ExactlyOnceError as exc:
        return _fail(args, err, out, exc, target)
    except BrokenPipeError:  # the reader of the output has gone: no failure of the command (``main``)
        raise
    except Exception as exc:
        return _unexpected(args, err, out, exc, target)
    finally:
        store.dispose()


#: Airflow's secrets masker, in its core's copy and its Task SDK's.
_SECRETS_MASKER_LOGGERS = (
    "airflow._shared.secrets_masker.secrets_masker",
    "airflow.sdk._shared.secrets_masker.secrets_masker",
)
#: What that masker says, once per process, when handed a value too short for it to mask.
_SHORT_SECRET_NOTICE = "Skipping masking for a secret as it's too short"


def _drop_short_secret_notice(record: logging.LogRecord) -> bool:
    """Reading a connection (a sink's Iceberg connection, to rebuild its committer) hands Airflow's
    masker every value of the connection's extra, and the masker warns about a short one before it
    asks whether the key names a secret at all: an Iceberg connection's ``"type": "sql"`` (or
    ``rest``, ``glue``, ``hive``) made every action print that warning. The warning asks nothing of
    whoever runs eo-sink, whose own output masks a password of any length (``core.errors``), so
    this one notice is dropped; every other line of the masker, and of Airflow, stays."""
    return not str(record.msg).startswith(_SHORT_SECRET_NOTICE)


def _mask_log_records() -> None:
    """Mask every log record of this process as it is made, whoever configures the handlers later
    (Airflow replaces them when it is first imported): a library's message or traceback that
    quotes a URL must not put its password on the terminal."""
    make = logging.getLogRecordFactory()
    if getattr(make, "masks_userinfo", False):
        return

    def masked(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make(*args, **kwargs)
        try:
            record.msg, record.args = mask_userinfo(record.getMessage()), None
        except Exception:  # a record whose arguments do not format is left to the handler to report
            return record
        if record.exc_info and record.exc_info[1] is not None:
            record.exc_text = mask_userinfo("".join(traceback.format_exception(*record.exc_info)).rstrip())
        return record

    masked.masks_userinfo = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(masked)


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
    code = _report(args, err, out, type(exc).__name__, str(exc), exc.retryable, target)
    return EXIT_BUSY if isinstance(exc, SinkLocked) else code


def _unexpected(args: argparse.Namespace, err: TextIO, out: TextIO, exc: Exception, target: str) -> int:
    """A fault no refusal describes: reported like one (masked, one line, JSON), the traceback on request."""
    if os.environ.get(TRACEBACK_ENV) == "1":
        print(mask_userinfo(traceback.format_exc()).rstrip(), file=err)
    lines = str(exc).strip().splitlines()
    message = f"{lines[0] if lines else ''} (unexpected; set {TRACEBACK_ENV}=1 for the traceback)"
    return _report(args, err, out, type(exc).__name__, message, False, target)


def _report(
    args: argparse.Namespace, err: TextIO, out: TextIO, error: str, message: str, retryable: bool, target: str
) -> int:
    message = mask_userinfo(message)
    print(safe_text(bounded(f"eo-sink {args.command} {target}: {error}: {message}")), file=err)
    if args.json:
        print_json(
            out,
            {
                "error": error,
                "message": message,
                "retryable": retryable,
                "sink_id": getattr(args, "sink", None),
                "epoch": getattr(args, "epoch", None),
            },
        )
    return EXIT_FAILED


# -- commands ----------------------------------------------------------------------------------------


def _print_result(out: TextIO, args: argparse.Namespace, result: ActionResult) -> int:
    if args.json:
        print_json(out, result.model_dump(mode="json"))
    else:
        where = f"sink {result.sink_id!r}" + ("" if result.epoch is None else f" epoch {result.epoch}")
        prefix = "[dry run] " if result.dry_run else ""
        out.write(safe_text(f"{prefix}{result.action} {where}: {result.outcome}") + f"\n  {safe_text(result.detail)}\n")
    return EXIT_OK if result.ok else EXIT_FAILED


def _abort_command(ops: SinkOperations, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    result = ops.abort(
        args.sink,
        args.epoch,
        reason=args.reason,
        force=args.force,
        files_lost=args.files_lost,
        dry_run=args.dry_run,
    )
    return _print_result(out, args, result)


def _reject_command(ops: SinkOperations, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    return _print_result(out, args, ops.reject(args.sink, args.epoch, reason=args.reason, dry_run=args.dry_run))


def _commit_command(ops: SinkOperations, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    result = ops.commit(args.sink, args.epoch, dry_run=args.dry_run, allow_beyond_horizon=args.beyond_horizon)
    return _print_result(out, args, result)


def _cleanup_command(ops: SinkOperations, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    return _print_result(out, args, ops.cleanup(args.sink, args.epoch, dry_run=args.dry_run))


def _per_sink(
    ops: SinkOperations,
    args: argparse.Namespace,
    out: TextIO,
    err: TextIO,
    act: Callable[[str], ActionResult],
) -> int:
    """One sink, or each registered sink in turn: one sink's failure does not stop the others, and a
    sink another recovery holds is skipped, said on stdout as a result: it is being worked on, which is
    no failure, and the exit code (3, unless another sink failed) tells a schedule to run again."""
    if args.sink:
        return _print_result(out, args, act(args.sink))
    sink_ids = [s.sink_id for s in ops.sinks() if s.registered]
    results: list[dict[str, Any]] = []
    code = EXIT_OK
    busy = False
    for sink_id in sink_ids:
        try:
            result = act(sink_id)
        except SinkLocked as exc:
            busy = True
            skipped = _skipped(args, sink_id, exc)
            if args.json:
                results.append({**skipped.model_dump(mode="json"), "error": type(exc).__name__, "retryable": True})
            else:
                _print_result(out, args, skipped)
            continue
        except ExactlyOnceError as exc:
            print(safe_text(bounded(f"eo-sink {args.command} sink {sink_id!r}: {type(exc).__name__}: {exc}")), file=err)
            results.append({"sink_id": sink_id, "error": type(exc).__name__, "message": mask_userinfo(str(exc))})
            code = EXIT_FAILED
            continue
        if not result.ok:
            code = EXIT_FAILED
        if args.json:
            results.append(result.model_dump(mode="json"))
        else:
            _print_result(out, args, result)
    if args.json:
        print_json(out, {"results": results})
    elif not sink_ids:
        out.write("no registered sinks\n")
    return EXIT_BUSY if code == EXIT_OK and busy else code


def _skipped(args: argparse.Namespace, sink_id: str, exc: SinkLocked) -> ActionResult:
    """A locked sink's result among ``_per_sink``'s: nothing was done to it."""
    detail = f"{exc}; nothing was done to this sink: run `eo-sink {args.command} {sink_id}` again once that recovery has finished"
    return ActionResult(
        action=args.command,
        sink_id=sink_id,
        epoch=None,
        dry_run=args.dry_run,
        outcome="skipped",
        detail=detail,
        ok=False,
    )


def _recover_command(ops: SinkOperations, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    return _per_sink(ops, args, out, err, lambda sink_id: ops.recover(sink_id, dry_run=args.dry_run))


def _gc_command(ops: SinkOperations, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    return _per_sink(ops, args, out, err, lambda sink_id: ops.gc(sink_id, grace=args.grace, dry_run=args.dry_run))


COMMANDS: dict[str, Callable[[SinkOperations, argparse.Namespace, TextIO, TextIO], int]] = {
    "status": status_command,
    "epochs": epochs_command,
    "show": show_command,
    "history": history_command,
    "abort": _abort_command,
    "reject": _reject_command,
    "commit": _commit_command,
    "cleanup": _cleanup_command,
    "recover": _recover_command,
    "gc": _gc_command,
}

__all__ = ["EXIT_BUSY", "EXIT_FAILED", "EXIT_OK", "EXIT_USAGE", "build_parser", "duration", "main", "run"]
