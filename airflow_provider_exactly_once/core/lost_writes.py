"""Writes that can never be committed as written: files lost, or an upsert whose table moved under it.

The coordinator's abort (``files_lost``), the operations surface and the upsert group's rewrite task
come here; an epoch's ordinary life (persist, commit, abort) does not, and reads on in
``coordinator.py``. What may happen is decided in ``decisions.py`` (``files_lost_refusal``,
``rewrite_decision``); this module gathers what those decisions are taken on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection

from .decisions import Action, files_lost_refusal
from .errors import ReplacedFilesMissing, UpsertConflict
from .lookups import CheckpointLookup
from .outcomes import AbortResult, RewriteOutcome, RewriteResult
from .ports import EpochRecord, SinkCommitter
from .rewrite_decisions import REWRITE_REASON, rewrite_decision

log = logging.getLogger(__name__)


def lost_files(committer: SinkCommitter, row: EpochRecord) -> list[str]:
    """The data files of a Pending write that are gone, when that is reason enough to give it up.

    Refused (``AbortRefused``) while a table shows the epoch's write (it is partly visible: only
    restoring the files and committing keeps it whole) and while every file is there (commit).
    A revision's files count as lost also when those of the write it replaces left the table
    (``ReplacedFilesMissing``): the replacement can then never be made, and the earlier write stays.
    So do an upsert's when the table moved under it (``UpsertConflict``): its changes can then
    never be committed as written, and must be written again.
    """
    shown = shown_tables(committer, row)
    missing = [] if shown else list(committer.missing_files(row.pre_commit))
    if not shown and row.kind.lost_beyond_files:
        try:
            committer.prepare(row.pre_commit, replaces=row.replaces)
        except ReplacedFilesMissing as exc:
            missing += exc.missing
        except UpsertConflict as exc:
            missing += exc.conflicting
    refusal = files_lost_refusal(row, shown, missing)
    if refusal is not None:
        raise refusal
    return missing


def shown_tables(committer: SinkCommitter, row: EpochRecord) -> list[str]:
    """The tables that show this write's commit (of a revision: its own, not the write it replaces)."""
    visible = committer.find_committed(row.pre_commit, row.created_at)
    return [t for t in visible.tables if not row.kind.revises or visible.write_ids.get(t) == row.write_id]


def prepare_rewrite(
    row: EpochRecord,
    committer: SinkCommitter,
    checkpoint: CheckpointLookup,
    give_up: Callable[[str], AbortResult],
    run_writes: Collection[str] = (),
) -> RewriteResult:
    """Make way for writing an upsert epoch again after its write conflicted (``rewrite_decision``).

    A write persist refused for a conflict is Aborted already. An undecided write stays Pending: the
    next write's persist replaces it and removes its files. A decided one is given up as lost
    (``give_up``: the coordinator's abort with ``files_lost``, which checks that no table shows it),
    so that the next write re-opens the epoch. Refused (``RewriteRefused``) for a write that can
    still commit. ``run_writes``: the writes the run made so far (its write task's and earlier
    rewrites').
    """

    def conflict() -> UpsertConflict | None:
        try:
            committer.prepare(row.pre_commit, replaces=row.replaces)
        except UpsertConflict as exc:
            return exc
        return None

    shown = lambda: shown_tables(committer, row)  # noqa: E731
    decision = rewrite_decision(row, run_writes, conflict, checkpoint, shown).raise_if_refused()
    if decision.action is Action.ALREADY_COMMITTED:
        return RewriteResult(RewriteOutcome.ALREADY_COMMITTED, row, decision.why)
    if decision.action is Action.GIVE_UP_AND_REWRITE:
        given_up = give_up(f"{REWRITE_REASON}: {decision.why}")
        log.warning("%s: %s", row.pre_commit.describe(), decision.why)
        return RewriteResult(RewriteOutcome.GAVE_UP, given_up.record or row, decision.why)
    log.warning("%s: %s", row.pre_commit.describe(), decision.why)
    return RewriteResult(RewriteOutcome.REWRITE, row, decision.why)
