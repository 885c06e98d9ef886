"""Write an upsert epoch again after its commit met another writer's change (design.md D14).

Airflow cannot send a run back to an upstream task, so the task group lays the bounded loop out as a
chain (``rewrite_1 -> persist_1 -> commit_1 -> rewrite_2 ...``). A rewrite task runs only when the
commit before it failed, asks the coordinator whether the write conflicts (``prepare_rewrite``), and
if so runs the group's write operator again in this task, against the table as it is now.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from airflow_provider_exactly_once.checkpoints.config import CheckpointConfig
from airflow_provider_exactly_once.core.errors import InvalidPreCommit
from airflow_provider_exactly_once.operators._common import (
    airflow_errors,
    execute_nested,
    parse_pre_commit,
    pull_pre_commit,
)
from airflow_provider_exactly_once.operators.epoch import _EpochOperator
from airflow_provider_exactly_once.version_compat import AirflowFailException, AirflowSkipException

if TYPE_CHECKING:
    from airflow.sdk import Context


class RewriteEpochOperator(_EpochOperator):
    """After a failed commit: write the run's upsert epoch again when its write conflicts with the table.

    Skipped when the epoch is committed after all; failed, without writing, when the commit failed
    for another reason than a conflict (the write is kept: a retry of the commit can still make it
    visible) or when the epoch was aborted (the run's failure lies upstream). Give it the write
    task's queue, pool and retries: it runs that task's operator, Spark job and all.

    :param write_task_id: the group's write task, whose operator this task runs again.
    :param earlier_rewrite_task_ids: the rewrite tasks before this one: with the write task, they
        made this run's writes, and an epoch committed with none of them means this run's was refused.
    :return: the new write's pre-commit metadata, as the write task returns it (persist reads it).
    """

    ui_color = "#fdf1dc"

    def __init__(
        self,
        *,
        checkpoint: CheckpointConfig | Mapping[str, Any],
        write_task_id: str,
        earlier_rewrite_task_ids: Sequence[str] = (),
        **kwargs: Any,
    ) -> None:
        super().__init__(checkpoint=checkpoint, **kwargs)
        self.write_task_id = write_task_id
        self.earlier_rewrite_task_ids = list(earlier_rewrite_task_ids)
        self._write: BaseOperator | None = None

    def execute(self, context: Context) -> Any:
        with airflow_errors(), self._step(context) as step:
            run_writes = self._run_writes(context)
            result = step.coordinator.prepare_rewrite(self.sink.sink_id, step.epoch, run_writes=run_writes)
        from airflow_provider_exactly_once.core.outcomes import RewriteOutcome

        if result.outcome is RewriteOutcome.ALREADY_COMMITTED:
            raise AirflowSkipException(f"sink {self.sink.sink_id!r} epoch {step.epoch}: {result.why}")
        write = self._write_operator()
        self.log.warning(
            "sink %r epoch %d: %s (%s); running task %r again",
            self.sink.sink_id,
            step.epoch,
            result.outcome.value,
            result.why,
            self.write_task_id,
        )
        # The write's templates, rendered for this run as its own task would render them.
        write.render_template_fields(context)
        self._write = write
        return execute_nested(write, context)

    def on_kill(self) -> None:
        """A killed rewrite kills the write it runs (a Spark driver, say), as the write task would."""
        if self._write is not None:
            self._write.on_kill()

    def _run_writes(self, context: Mapping[str, Any]) -> set[str]:
        """The write ids this run's write and earlier rewrite tasks returned (unreadable ones left out)."""
        found: set[str] = set()
        for task_id in (self.write_task_id, *self.earlier_rewrite_task_ids):
            value = pull_pre_commit(context, task_id)
            if value is None:
                continue
            try:
                found.add(parse_pre_commit(value).write_id)
            except InvalidPreCommit:
                self.log.warning("Ignoring the unusable XCom of task %r", task_id)
        return found

    def _write_operator(self) -> BaseOperator:
        dag = self.get_dag()
        task = None if dag is None else dag.task_dict.get(self.write_task_id)
        if not isinstance(task, BaseOperator):
            raise AirflowFailException(
                f"task {self.task_id}: the write task {self.write_task_id!r} is not in this DAG, so the epoch "
                "cannot be written again here; clear the run to write it"
            )
        return task
