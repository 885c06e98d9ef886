"""Domain errors.

Storage and catalog errors are translated into these at the layer that meets them, so operators
can tell a retryable fault (the task should be retried) from a refusal (retrying cannot help and
a person must look) without knowing SQLAlchemy or pyiceberg.
"""

from __future__ import annotations

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
    """Data files listed in the pre-commit metadata are not in storage at commit time.

    The commit is refused and the epoch stays Pending: the files may still appear (eventual
    consistency, a restore), or an operator gives the write up (``abort(..., files_lost=True)``).
    """

    def __init__(self, sink_id: str, epoch: int, paths: Sequence[str]) -> None:
        self.paths = list(paths)
        shown = ", ".join(self.paths[:10]) + (f" (and {len(self.paths) - 10} more)" if len(self.paths) > 10 else "")
        super().__init__(
            f"sink {sink_id!r} epoch {epoch}: {len(self.paths)} data file(s) missing: {shown}. Restore them and "
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
    must undo (``sinks.iceberg.upsert_overwrites``); writing it again cannot help there.

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
    not planned against the committed write (``core.upsert_revisions``), or planned against a table
    state that is gone. The new write is removed; the epoch keeps what it committed."""


class EarlierEpochUndecided(ExactlyOnceError):
    """An upsert epoch may not commit while an earlier epoch of its sink is still undecided: changes
    by key only mean something applied in epoch order. Retrying later succeeds once it is decided."""

    retryable = True


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
