"""The domain's errors, and what of any text may be shown: secrets masked, terminal controls escaped.

Storage and catalog errors are translated into these errors at the layer that meets them, so an
operator tells a retryable fault from a refusal without knowing SQLAlchemy or pyiceberg. Locations,
URLs and stored messages reach people through many doors (the UI, ``eo-sink``, exception texts, log
lines), so each door passes its text through ``mask_userinfo`` and ``escape_controls`` here, the one
place that knows what a secret or a terminal control looks like. Standard library only: every layer
imports it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence


class ExactlyOnceError(Exception):
    """Base of every error this package raises on purpose."""

    #: Whether running the same step again may succeed without anyone changing anything.
    retryable: bool = False


class InvalidPreCommit(ExactlyOnceError, ValueError):
    """Pre-commit metadata that cannot be accepted as given."""


class InvalidIdentifier(InvalidPreCommit):
    """A sink id, epoch or write id that cannot be accepted, wherever it was given (a CLI argument,
    a URL, a run's context). A pre-commit carries all three, so what refuses a bad pre-commit also
    refuses a bad identifier inside one."""


class InvalidSinkConfig(ExactlyOnceError, ValueError):
    """A sink, committer or checkpoint source configured with values that cannot work."""


class SinkReused(InvalidSinkConfig):
    """A sink id now names other tables than the ones its epochs were committed to.

    An epoch committed to one table proves nothing for another, so a write for it can be neither
    committed (the old commit may have been right) nor skipped as done (the new table would
    silently miss it); a sink id must name one destination for its whole history.
    """


class MetaStoreUnavailable(ExactlyOnceError):
    """The meta store could not be reached or timed out; nothing was half-written."""

    retryable = True


class StateConflict(ExactlyOnceError):
    """A compare-and-swap on ``pending_sink_state`` matched no row.

    Another attempt (a zombie, a concurrent retry, an operator) changed the epoch first. The late
    attempt must stop here, loudly, rather than act on a state it no longer owns.
    """


class RevisionInProgress(ExactlyOnceError):
    """A newer generation's write reached an epoch whose commit of another write is under way.

    The newer write must win (invariant 1), and it can only replace a committed write: retrying
    the persist once that commit finished opens the revision.
    """

    retryable = True


class SinkLocked(ExactlyOnceError):
    """Another recovery holds the sink's lock: it is doing this work right now, and this one did nothing."""

    retryable = True


class EpochNotFound(ExactlyOnceError):
    """No row exists for the (sink, epoch): it was never persisted."""


class EpochAborted(ExactlyOnceError):
    """A commit was asked for an epoch that is already Aborted."""


class CheckpointNotReady(ExactlyOnceError):
    """The epoch's checkpoint is still PENDING: committing now would break invariant 2."""

    retryable = True


class CheckpointFailed(ExactlyOnceError):
    """The epoch's checkpoint FAILED: the epoch can only be aborted."""


class AbortRefused(ExactlyOnceError):
    """An abort that would contradict a durable decision (checkpoint completed, commit decided)."""


class MissingDataFiles(ExactlyOnceError):
    """Data files listed in the pre-commit metadata, or the manifest persist wrote of them below the
    write location, are not in storage at commit time (design.md, 'The Iceberg commit', step 3).

    The commit is refused and the epoch stays Pending: the files may still appear (eventual
    consistency, a restore), or an operator gives the write up (``abort(..., files_lost=True)``).
    """

    def __init__(self, sink_id: str, epoch: int, paths: Sequence[str]) -> None:
        self.paths = list(paths)
        shown = ", ".join(self.paths[:10]) + (f" (and {len(self.paths) - 10} more)" if len(self.paths) > 10 else "")
        super().__init__(
            f"sink {sink_id!r} epoch {epoch}: {len(self.paths)} file(s) of its write missing: {shown}. Restore them and "
            f"commit again (eo-sink commit {sink_id} {epoch}); if they are lost for good, give the write up "
            f"(eo-sink abort {sink_id} {epoch} --reason ... --files-lost) and write the epoch again"
        )


class ReplacedFilesMissing(ExactlyOnceError):
    """Files of the write a revision replaces are no longer in the sink (compacted or deleted by
    another engine): replacing them would show the epoch's rows twice, so the revision is refused.

    ``missing`` names the files. Before the commit decision the revision is simply aborted; after
    it, the abort names them as lost (``files_lost``), and the earlier write stays committed.
    """

    def __init__(self, message: str, missing: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.missing = missing


class InvalidChanges(ExactlyOnceError, ValueError):
    """An upsert epoch's input that cannot be applied as changes by key (a null key, an unknown
    operation, two changes of one key the sink's rule cannot order); refused before any write."""


class UpsertConflict(ExactlyOnceError):
    """The table changed under an upsert write in a way its copy-on-write cannot absorb: a file it
    rewrote is gone (a compaction, another upsert), or a file added since its read may hold the
    epoch's keys. Committing it would resurrect deleted rows or lose updates, so nothing is
    committed; the epoch's changes must be written again against the table as it is now.

    A revision of a committed upsert epoch meets it when a later commit changed what the revision
    must undo (``sinks.iceberg.overwrites``); writing it again cannot help there.

    ``conflicting`` names what conflicts: files gone or added, a delete manifest, a snapshot.
    """

    def __init__(self, message: str, conflicting: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.conflicting = conflicting


class RewriteRefused(ExactlyOnceError):
    """A rewrite task found nothing it may write again: the epoch's commit did not fail on an
    upsert conflict (it failed for another reason, or the epoch was aborted), so its write is kept
    for the commit to retry, or the run's failure is somebody else's to look at."""


class ReprocessRefused(ExactlyOnceError):
    """A newer generation's write for an epoch committed as changes by key that cannot revise it:
    not planned against the committed write (``core.decisions``), or planned against a table
    state that is gone. The new write is removed; the epoch keeps what it committed."""


class EarlierEpochUndecided(ExactlyOnceError):
    """An upsert epoch may not commit while an earlier epoch of its sink is still undecided: changes
    by key only mean something applied in epoch order. Retrying later succeeds once it is decided."""

    retryable = True


class AuditNotPassed(ExactlyOnceError):
    """An audited sink's write is published only after its audit passed (design.md D23): its audit
    has not run yet, or failed. A failed audit is settled by reprocessing the run or rejecting the
    epoch (``eo-sink reject``); retrying the publish changes nothing."""


class WriteFailed(ExactlyOnceError):
    """The epoch writer's Spark job failed (a cast that overflows, an unreadable input, a lost
    executor): ``cause`` is the error Spark raised, in one line, which the epoch keeps as the write
    task's failure (design.md D22). Retried as the task's retries say, as any failed job is."""

    retryable = True

    def __init__(self, message: str, cause: str | None = None) -> None:
        super().__init__(message)
        self.cause = cause or message


class InputRangeRefused(ExactlyOnceError):
    """An epoch's range of an incremental input (``core.input_ranges``) cannot be reserved or read:
    the epoch is behind the sink's chain, its range went to a later epoch, or the upstream snapshots
    in it are not appends or are gone. Retrying cannot help; the message says what can."""


class SchemaMismatch(ExactlyOnceError):
    """The written schema cannot go into the table; refused before anything was committed."""


class CommitRefused(ExactlyOnceError):
    """The table refuses the commit for a reason retrying cannot change: the configured branch is a
    tag, the table's format is one the committer cannot write, or pyiceberg refused the append while
    staging it. Nothing was committed; a person must change the table or the sink's configuration."""


class UnknownTable(ExactlyOnceError):
    """The catalog has no such table (or no such catalog)."""


class SinkUnavailable(ExactlyOnceError):
    """The catalog or the file system could not be reached; nothing was made visible."""

    retryable = True


class SparkUnavailable(ExactlyOnceError):
    """The Spark a write runs on (a Spark Connect server) did not answer; nothing was written."""

    retryable = True


class CommitOutcomeUnknown(ExactlyOnceError):
    """The catalog did not say whether the commit landed.

    Never a reason to delete anything (invariant 4): the next attempt loads the table and looks for
    the marker, which decides.
    """

    retryable = True


class CommitConflictExhausted(ExactlyOnceError):
    """Other writers kept winning the table's commit race for every bounded retry."""

    retryable = True


class ForeignWriteVisible(ExactlyOnceError):
    """The table already shows this epoch committed by another write than the row's.

    This cannot happen while the coordinator's commit decision fences writes; seeing it means
    something outside this package committed with our marker, so nothing is changed automatically.
    """


class MarkerHorizonExceeded(ExactlyOnceError):
    """The epoch is older than the table keeps snapshots: absence of its marker proves nothing.

    Committing it again could duplicate data, so recovery refuses unless explicitly allowed.
    """


#: What replaces a secret.
MASK = "***"

#: Parts of a catalog or FileIO property name that mark its value as a secret (``s3.secret-access-key``,
#: ``s3.session-token``, the REST ``credential``...): masked wherever such a value could be quoted.
SECRET_PROPERTY_MARKS = ("secret", "token", "password", "credential")
#: What may not stand in a templated field at all, shown as it is once rendered: the secrets, and the
#: key ids and account keys that are half of a credential (``s3.access-key-id``, ``adls.account-key``).
CREDENTIAL_PROPERTY_MARKS = (*SECRET_PROPERTY_MARKS, "account-key", "access-key", "private-key")
#: Parts of the name of a ``name=value`` pair, anywhere in a text, that mark its value as a secret:
#: libpq's ``password=`` and ``sslpassword=``, ODBC's ``PWD=``, ``client_secret=``, ``access_token=``.
#: Names are compared in lower case with ``_`` and ``.`` read as ``-``. ``key`` alone is not one here:
#: free text says ``key=id`` of an upsert sink's key.
SECRET_NAME_MARKS = (*CREDENTIAL_PROPERTY_MARKS, "passwd", "pwd")
#: The same for a URL's query parameters (after ``?``, ``&`` or ``;``), where more names are secrets:
#: the signatures and credentials of pre-signed URLs (Azure SAS ``sig``, ``X-Amz-Signature``,
#: ``X-Amz-Credential``, ``X-Amz-Security-Token``, ``X-Goog-Signature``), every ``...key...``
#: (``api_key``, ``apikey``, ``key``) and ``auth``. Masking a harmless parameter of a similar name
#: costs a value nobody needed; missing a secret one cannot be undone.
SECRET_PARAMETER_MARKS = (*SECRET_NAME_MARKS, "sig", "key", "auth")

#: C0 controls (incl. TAB, LF, CR, ESC, BEL), DEL, and the C1 controls (U+0080..U+009F, e.g. CSI).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")

#: ``scheme://`` followed by the rest of the token (a URL ends at whitespace or a quote).
_URL = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<rest>[^\s'\"<>`]*)")
#: ``user:secret@`` with no scheme in front (``user:pw@host/db``, a URL written without ``//``).
_BARE_USERINFO = re.compile(r"(?<![\w.+\-/:@])(?P<user>[\w.+\-%]+):(?!/)(?P<secret>[^\s@/]*(?:/[^\s@/]*)*)@")
#: ``name=value``: a query parameter (after ``?``, ``&``, ``;``) or a keyword of a connection string
#: (libpq's ``password='it''s'``, quoted with ``'`` and ``\\``-escapes, or ``"``); not a path segment.
_ASSIGNMENT = re.compile(
    r"(?<![\w.\-/])(?P<name>[A-Za-z][\w.\-]*)(?P<eq>\s*=\s*)"
    r"(?P<value>'(?:[^'\\]|\\.)*(?:'|$)|\"(?:[^\"\\]|\\.)*(?:\"|$)|[^\s'\"&;#<>`]*)"
)


def _masked_userinfo(userinfo: str) -> str:
    """``user:secret`` becomes ``user:***``; a lone user (often a token) becomes ``***``."""
    user, colon, _ = userinfo.partition(":")
    return f"{user}:{MASK}" if colon and user else MASK


def _split_userinfo(rest: str) -> tuple[str, str] | None:
    """``(userinfo, remainder)`` of what follows ``scheme://``, or ``None`` when it has none.

    The authority ends at the first ``/``, ``?`` or ``#``, and its userinfo at its *last* ``@`` (a
    password may hold an unencoded ``@``). A secret that holds an unencoded ``/`` (S3 secret keys
    do) cuts that authority short, so when the text before the first ``/`` looks like
    ``user:secret`` rather than ``host:port``, the userinfo runs to the next ``@``.
    """
    if not rest or rest[0] in "/?#":
        return None
    end = len(rest)
    for stop in "/?#":
        found = rest.find(stop)
        if found != -1:
            end = min(end, found)
    authority = rest[:end]
    at = authority.rfind("@")
    if at != -1:
        return authority[:at], rest[at + 1 :]
    _, colon, secret = authority.partition(":")
    if colon and not secret.isdigit():
        at = rest.find("@", end)
        if at != -1:
            return rest[:at], rest[at + 1 :]
    return None


def _cut_userinfo(text: str, match: re.Match[str]) -> int | None:
    """Where the userinfo of a URL cut short by a quote, a space, a backtick or ``<`` ends (its ``@``).

    A URL ends at such a character, but an unencoded password may hold one (``eo:ab'S@db``): when
    the URL's authority so far reads ``user:secret`` without an ``@``, the userinfo runs to the next
    ``@`` on the line. A ``host:port`` (all digits) followed by a later sentence is left alone unless
    nothing but non-blank characters stand between it and the ``@``.
    """
    rest = match.group("rest")
    user, colon, secret = re.split(r"[/?#]", rest, maxsplit=1)[0].partition(":")
    if not colon or not user or user.startswith("[") or "@" in rest or match.end() >= len(text):
        return None
    line_end = text.find("\n", match.end())
    at = text.find("@", match.end(), len(text) if line_end == -1 else line_end)
    if at == -1 or (secret.isdigit() and any(c.isspace() for c in text[match.end() : at])):
        return None
    return at


def _mask_urls(text: str) -> str:
    shown: list[str] = []
    done = 0
    for match in _URL.finditer(text):
        if match.start() < done:  # inside the userinfo of a URL already masked
            continue
        scheme, rest = match.group("scheme"), match.group("rest")
        shown.append(text[done : match.start()])
        split = _split_userinfo(rest)
        if split is not None:
            userinfo, remainder = split
            shown.append(f"{scheme}{_masked_userinfo(userinfo)}@{remainder}")
            done = match.end()
        elif (at := _cut_userinfo(text, match)) is not None:
            shown.append(f"{scheme}{_masked_userinfo(text[match.start('rest') : at])}@")
            done = at + 1
        else:
            shown.append(match.group(0))
            done = match.end()
    return "".join(shown) + text[done:]


def _is_secret_name(name: str, marks: tuple[str, ...]) -> bool:
    name = name.lower().replace("_", "-").replace(".", "-")
    return any(mark in name for mark in marks)


def _mask_assignment(match: re.Match[str]) -> str:
    start = match.start()
    parameter = start > 0 and match.string[start - 1] in "?&;"
    marks = SECRET_PARAMETER_MARKS if parameter else SECRET_NAME_MARKS
    if not match.group("value") or not _is_secret_name(match.group("name"), marks):
        return match.group(0)
    return f"{match.group('name')}{match.group('eq')}{MASK}"


def mask_userinfo(text: str) -> str:
    """``text`` with every secret a location, URL or connection string can carry replaced by ``***``.

    - userinfo: ``postgresql://u:p@ss@host/db`` shows as ``postgresql://u:***@host/db``,
      ``s3://AKIA:ab/cd@bkt/x`` as ``s3://AKIA:***@bkt/x``, ``https://token@host`` as
      ``https://***@host``, ``u:pw@host/db`` (no scheme) as ``u:***@host/db``, and a password holding
      a quote, a space, a backtick or ``<`` (``postgresql://eo:ab'S@db/x``) as ``postgresql://eo:***@db/x``;
    - query parameters named by ``SECRET_PARAMETER_MARKS``: ``https://cat/v1?token=S&warehouse=w``
      shows as ``https://cat/v1?token=***&warehouse=w``, and so do ``sig=``, ``X-Amz-Signature=``,
      ``X-Amz-Credential=``, ``X-Amz-Security-Token=``, ``password=``;
    - ``name=value`` pairs named by ``SECRET_NAME_MARKS`` (libpq's ``host=db password='se cret'``
      shows as ``host=db password=***``).

    A path that merely contains an ``@``, or a parameter whose name only resembles a secret's, may be
    masked too: showing less is the price of never showing a secret.
    """
    if "@" in text:
        text = _BARE_USERINFO.sub(lambda m: f"{m.group('user')}:{MASK}@", _mask_urls(text))
    if "=" in text:
        text = _ASSIGNMENT.sub(_mask_assignment, text)
    return text


def has_userinfo(location: str) -> bool:
    """Whether a location or URL carries a secret that masking would hide (userinfo, a secret parameter)."""
    return mask_userinfo(location) != location


def find_control(text: str) -> str | None:
    """The first control character in ``text`` as ``U+001B``, or ``None`` when it has none."""
    found = _CONTROL.search(text)
    return None if found is None else f"U+{ord(found.group(0)):04X}"


def escape_controls(text: str) -> str:
    """``text`` with every control character shown as ``\\x1b``-style escapes: safe on a terminal."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group(0)):02x}", text)


def safe_text(text: str) -> str:
    """What a terminal or a log line may show of stored or reported text: masked, then escaped."""
    return escape_controls(mask_userinfo(text))


__all__ = [
    "MASK",
    "SECRET_NAME_MARKS",
    "SECRET_PARAMETER_MARKS",
    "escape_controls",
    "find_control",
    "has_userinfo",
    "mask_userinfo",
    "safe_text",
]
