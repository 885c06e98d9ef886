"""A write that reaches persist through its storage instead of through XCom.

A Spark operator that is not ours (the Spark provider's ``SparkSubmitOperator``, a platform's own
operator, a ``@task`` running PySpark) returns no pre-commit; the epoch writer leaves one in the
first target's write location whatever runs it (``sinks/layout.py``). Persist then looks among the
sink's write locations that the meta store does not know (the ones the orphan scan sees too) for
pre-commits of the run's epoch, and takes the newest.

What it leaves behind stays unknown to the store: an earlier try whose driver died after writing its
pre-commit, a run that never reached persist. Those are orphans, removed after the grace like any
other (``core/cleanups.py``). A location without a readable pre-commit (a write still running, or
half written by a dead driver) is never taken, and neither is a pre-commit of another sink, epoch or
write id than its folder's.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from .cleanups import FileAge, WriteFolder
from .errors import InvalidPreCommit
from .ports import SinkRegistry
from .precommit import PreCommit

log = logging.getLogger(__name__)


class NoWriteLeft(InvalidPreCommit):
    """The write task returned no pre-commit and no finished write of the epoch left one."""


@dataclass(frozen=True)
class LeftWrite:
    pre_commit: PreCommit
    #: The newest modification time of the write's files (``None``: unknown).
    newest: datetime | None


def left_writes(
    sink_id: str, epoch: int, folders: Mapping[str, Sequence[WriteFolder]], registry: SinkRegistry
) -> list[LeftWrite]:
    """The finished writes of the sink's ``epoch`` that no row or clean-up of the store names, newest
    first (those of unknown age last)."""
    unknown = sorted(set(folders) - registry.known_writes(sink_id, sorted(folders)))
    found: list[LeftWrite] = []
    for write_id in unknown:
        pre_commit = _left_in(write_id, folders[write_id])
        if pre_commit is None or (pre_commit.sink_id, pre_commit.epoch) != (sink_id, epoch):
            continue
        age = FileAge.combined([folder.age() for folder in folders[write_id]])
        found.append(LeftWrite(pre_commit, age.newest))
    dated = sorted((w for w in found if w.newest is not None), key=lambda w: w.newest or datetime.min, reverse=True)
    return dated + [w for w in found if w.newest is None]


def newest_left_write(
    sink_id: str, epoch: int, folders: Mapping[str, Sequence[WriteFolder]], registry: SinkRegistry, task: str
) -> PreCommit:
    """The write persist takes when task ``task`` returned none: the newest finished one."""
    found = left_writes(sink_id, epoch, folders, registry)
    if not found:
        raise NoWriteLeft(
            f"task {task!r} returned no pre-commit, and no finished write of sink {sink_id!r} epoch {epoch} left one "
            f"in the sink's write locations ({len(folders)} listed): the write task must run the epoch writer "
            "(its application, or write_epoch in a PySpark job), which leaves it there; clear the write task "
            "to write the epoch again"
        )
    chosen, *others = found
    if others:
        log.warning(
            "sink %r epoch %d: %d finished writes left no XCom; taking the newest, %s; %s stay unknown to the "
            "store and are removed as orphans after the grace",
            sink_id,
            epoch,
            len(found),
            chosen.pre_commit.write_id,
            ", ".join(w.pre_commit.write_id for w in others),
        )
    return chosen.pre_commit


def _left_in(write_id: str, folders: Sequence[WriteFolder]) -> PreCommit | None:
    for folder in folders:
        data = folder.left_pre_commit()
        if data is None:
            continue
        try:
            pre_commit = PreCommit.from_json(data)
        except InvalidPreCommit as exc:
            log.info("write %s: its pre-commit at %s is unreadable, not taken: %s", write_id, folder.location, exc)
            return None
        return pre_commit if pre_commit.write_id == write_id else None
    return None
