"""The input of a harness pipeline whose Spark write a scenario kills (``Scenario.write_pause_s``).

The hour's landed JSON lines, as the pipeline's ``FilesInput`` reads them, but each row pausing on
the executors, and each executor task, before its first row, leaving a file named by the write id in
``options["started"]``. A scenario's action waits for that file: the write is then running on the
Spark it is about to kill (a Spark Connect server's executors), which a wait on the task's state
alone cannot tell from a task still opening its session. Its rows are the hour's, unchanged, so the
checker judges the table from the landed input as for any other writer.

Called as a ``FunctionInput`` (``module:function``) by the write's driver: the Airflow task's process
on Spark Connect. The function given to ``mapInArrow`` is defined inside it, so Spark ships it by
value: the server's Python workers need no import of this module.
"""

from __future__ import annotations

from typing import Any


def slow_hour(spark: Any, context: Any) -> Any:
    """``options``: ``path`` (the hour's directory, a ``{start:...}`` template), ``schema_ddl``,
    ``seconds_per_row`` and ``started`` (a directory on the executors' machine)."""
    options = context.options
    path = str(options["path"]).format(start=context.data_interval_start)
    frame = spark.read.schema(options["schema_ddl"]).json(f"{path.rstrip('/')}/*.json")
    pause = float(options["seconds_per_row"])
    started = f"{str(options['started']).rstrip('/')}/{context.write_id}"

    def slowly(batches: Any) -> Any:
        import os
        import time

        first = True
        for batch in batches:
            if first:
                os.makedirs(os.path.dirname(started), exist_ok=True)
                with open(started, "a", encoding="utf-8") as marker:
                    marker.write(f"{os.getpid()}\n")
                first = False
            time.sleep(pause * batch.num_rows)
            yield batch

    return frame.mapInArrow(slowly, frame.schema)
