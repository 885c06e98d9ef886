"""The two places where pyiceberg 0.12's ``Transaction`` must behave differently for sink commits.

Both rely on private attributes, pinned by ``pyiceberg<0.13`` in pyproject.toml; keeping them in this
one module means an upgrade has one file to re-check.

1. ``commit_transaction`` retries a ``CommitFailedException`` itself by rebasing the registered
   snapshot producers onto the new head (``commit.retry.*`` table properties). That rebase does not
   look for our marker again, so a concurrent commit of the same epoch would be duplicated
   (design.md section 5, step 4). ``commit_once`` detaches the producers so the first conflict comes
   back to the committer, which reloads the table and re-checks the marker.
2. ``Transaction.table_metadata`` re-applies every staged update and deep-copies the whole metadata
   (every snapshot of the table's history) on each access, and one fast append reads it about sixteen
   times. A table with a long history then makes every commit, and so recovery of many epochs,
   cost O(history) many times over. The metadata only changes when an update is staged, so it is
   cached until then.
"""

from __future__ import annotations

from typing import Any

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table, Transaction
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import update_table_metadata


class SinkCommitConflict(Exception):
    """The catalog refused the commit because the table moved on: nothing landed, try again."""


class SinkTransaction(Transaction):
    """A transaction that caches its applied metadata and commits at most once, without rebasing."""

    def __init__(self, table: Table) -> None:
        super().__init__(table, autocommit=False)
        self._applied: tuple[int, int, TableMetadata] | None = None

    @property
    def table_metadata(self) -> TableMetadata:
        if not self._updates:
            return self._table.metadata  # nothing to apply; the model is immutable, so no copy is needed
        key = (id(self._table.metadata), len(self._updates))
        if self._applied is None or self._applied[:2] != key:
            self._applied = (*key, update_table_metadata(self._table.metadata, self._updates))
        return self._applied[2]

    def commit_once(self) -> Table:
        """Commit the staged updates; a conflict raises ``SinkCommitConflict`` with nothing left behind.

        Any other exception is passed on untouched: its outcome may be unknown, so nothing is deleted.
        """
        producers: list[Any] = list(self._snapshot_producers)
        self._snapshot_producers = []  # pyiceberg's retry loop re-raises at once without producers
        try:
            return self.commit_transaction()
        except CommitFailedException as exc:
            # Certainly not committed: delete the manifests this attempt wrote (pyiceberg would have,
            # had the producers still been registered).
            for producer in producers:
                producer._clean_all_uncommitted()
            raise SinkCommitConflict(str(exc)) from exc
