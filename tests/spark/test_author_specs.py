"""The specs a DAG author writes, refused where the DAG file builds them: one line naming the spec and
the argument, shown as the DAG's import error, never a value that fails later in a task."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from airflow_provider_exactly_once.core.errors import InvalidSinkConfig
from airflow_provider_exactly_once.spark.author_specs import FilesInput, IcebergTableInput

SNAPSHOT_ID_MAX = 2**63 - 1


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"table": "up.t\x1b]0;pwned\x07"}, r"table: 'up\.t\\x1b\]0;pwned\\x07' holds the control character U\+001B"),
        ({"table": "up.t\x00"}, r"table: 'up\.t\\x00' holds the control character U\+0000"),
        ({"table": "up." + "t" * 100_000}, r"table: 'up\.tttt.*'\.\.\. is 100003 characters long; .* at most 512"),
        ({"table": "events"}, r"table: 'events' is not namespace\.table"),
        ({"table": "up.t", "start_after_snapshot_id": -5}, r"start_after_snapshot_id: '-5' is not a snapshot id"),
        ({"table": "up.t", "start_after_snapshot_id": True}, r"start_after_snapshot_id: 'True' is not a snapshot id"),
        ({"table": "up.t", "start_after_snapshot_id": 2**70}, r"start_after_snapshot_id: '1180591620717411303424' is"),
        ({"table": "up.t", "start_after_snapshot_id": 2**63}, r"start_after_snapshot_id: '9223372036854775808' is"),
        ({"table": "up.t", "start_after_snapshot_id": "five"}, r"start_after_snapshot_id: Input should be a valid"),
    ],
)
def test_an_incremental_input_refuses_a_bad_argument_when_it_is_built(arguments: dict[str, object], named: str) -> None:
    with pytest.raises(InvalidSinkConfig, match=rf"^IcebergTableInput: {named}") as refused:
        IcebergTableInput(**arguments)  # type: ignore[arg-type]
    message = str(refused.value)
    assert "\n" not in message and len(message) < 400 and "\x1b" not in message and "\x00" not in message
    if "snapshot id" in message:
        assert f"an integer from 0 to {SNAPSHOT_ID_MAX}" in message and "or None" in message


def test_an_incremental_input_takes_real_snapshot_ids_and_names() -> None:
    assert IcebergTableInput(table="bronze.events", start_after_snapshot_id=SNAPSHOT_ID_MAX).start_after_snapshot_id
    assert IcebergTableInput(table="cat.bronze.events", start_after_snapshot_id=0).start_after_snapshot_id == 0
    assert IcebergTableInput(table="b." + "e" * 510).table.startswith("b.e")
    # A templated dict input renders its numbers as text: the task's parse still reads them.
    rendered = IcebergTableInput.model_validate({"table": "bronze.events", "start_after_snapshot_id": "77"})
    assert rendered.start_after_snapshot_id == 77
    with pytest.raises(ValueError, match="start_after_snapshot_id: '-77' is not a snapshot id"):
        IcebergTableInput.model_validate({"table": "bronze.events", "start_after_snapshot_id": "-77"})


def test_every_spec_refuses_in_one_line_naming_the_argument() -> None:
    with pytest.raises(InvalidSinkConfig) as refused:
        FilesInput(format="xml", path="")  # type: ignore[arg-type]
    assert str(refused.value) == (
        "FilesInput: format: Input should be 'parquet', 'json' or 'csv'; path: String should have at least 1 character"
    )


def test_a_dag_file_building_a_bad_input_fails_its_parse_naming_the_argument(tmp_path: Path) -> None:
    from airflow.dag_processing.dagbag import DagBag

    dag_file = tmp_path / "silver.py"
    dag_file.write_text(
        textwrap.dedent(
            """
            import datetime as dt

            from airflow.sdk import DAG

            from airflow_provider_exactly_once.spark.author_specs import IcebergTableInput

            with DAG("silver", schedule=None, start_date=dt.datetime(2024, 1, 1)):
                SOURCE = IcebergTableInput(table="bronze.events", start_after_snapshot_id=True)
            """
        )
    )
    bag = DagBag(dag_folder=str(dag_file))
    [error] = bag.import_errors.values()
    assert "InvalidSinkConfig: IcebergTableInput: start_after_snapshot_id: 'True' is not a snapshot id" in error, error
