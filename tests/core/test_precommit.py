"""Pre-commit metadata: what a write may hand over, and the clear refusals of what it may not."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest

from airflow_provider_exactly_once.core.epochs import (
    SINK_ID_MAX_LENGTH,
    check_epoch,
    check_sink_id,
    epoch_from_interval_start,
    epoch_start,
)
from airflow_provider_exactly_once.core.errors import InvalidPreCommit
from airflow_provider_exactly_once.core.precommit import PreCommit


def _valid(**overrides: object) -> dict[str, object]:
    data: dict[str, object] = {
        "sink_id": "orders",
        "epoch": 1_700_000_000_000,
        "write_id": str(uuid.uuid4()),
        "tables": [
            {
                "table": "db.orders",
                "location": "file:///wh/db/orders/data/_eo/w1",
                "data_files": [
                    {
                        "path": "file:///wh/db/orders/data/_eo/w1/part-0.parquet",
                        "record_count": 3,
                        "file_size_in_bytes": 1024,
                        "partition": {"ts_day": 19700},
                        "value_counts": {"id": 3},
                        "lower_bounds": {"id": "AQAAAAAAAAA="},
                        "upper_bounds": {"id": "AwAAAAAAAAA="},
                    }
                ],
                "schema_written": [{"name": "id", "type": "long", "required": True}],
            }
        ],
        "source_positions": {"files": ["a.json"]},
    }
    data.update(overrides)
    return data


def test_round_trips_through_json_and_dict() -> None:
    pre = PreCommit.parse(_valid())
    assert PreCommit.from_json(pre.to_json()) == pre
    assert PreCommit.parse(json.loads(json.dumps(pre.model_dump(mode="json")))) == pre
    assert pre.record_count == 3
    assert not pre.is_empty
    data_file = pre.tables[0].data_files[0]
    assert data_file.bound_bytes("lower") == {"id": (1).to_bytes(8, "little")}


def test_an_epoch_with_no_files_is_valid_and_empty() -> None:
    pre = PreCommit.parse(_valid(tables=[{"table": "db.orders", "location": "/wh/x"}]))
    assert pre.is_empty
    assert pre.record_count == 0


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"sink_id": ""}, "sink_id is empty"),
        ({"sink_id": "x" * (SINK_ID_MAX_LENGTH + 1)}, "at most 128"),
        ({"sink_id": "a/b"}, "unsafe in a path"),
        ({"sink_id": "a..b"}, "unsafe in a path"),
        ({"sink_id": "-lead"}, "unsafe in a path"),
        ({"epoch": -1}, "epoch -1 is negative"),
        ({"epoch": 2**63}, "does not fit in 64 bits"),
        ({"epoch": "12"}, "epoch must be an integer"),
        ({"epoch": True}, "epoch must be an integer"),
        ({"write_id": "not-a-uuid"}, "is not a UUID"),
        ({"tables": []}, "tables"),
        ({"version": 2}, "version"),
        ({"unexpected": 1}, "unexpected"),
    ],
)
def test_bad_keys_are_refused_with_the_field_named(change: dict[str, object], named: str) -> None:
    with pytest.raises(InvalidPreCommit, match=named):
        PreCommit.parse(_valid(**change))


def test_missing_field_and_wrong_type_are_named() -> None:
    data = _valid()
    del data["write_id"]
    with pytest.raises(InvalidPreCommit, match=r"write_id: Field required"):
        PreCommit.parse(data)
    bad_file = _valid()
    bad_file["tables"][0]["data_files"][0]["record_count"] = "three"  # type: ignore[index]
    with pytest.raises(InvalidPreCommit, match=r"tables\.0\.data_files\.0\.record_count"):
        PreCommit.parse(bad_file)


def test_a_path_outside_the_write_location_is_refused() -> None:
    data = _valid()
    data["tables"][0]["data_files"][0]["path"] = "file:///etc/passwd"  # type: ignore[index]
    with pytest.raises(InvalidPreCommit, match=r"outside the write location .*file:///etc/passwd"):
        PreCommit.parse(data)
    sneaky = _valid()
    sneaky["tables"][0]["data_files"][0]["path"] = "file:///wh/db/orders/data/_eo/w1/../../x.parquet"  # type: ignore[index]
    with pytest.raises(InvalidPreCommit, match="outside the write location"):
        PreCommit.parse(sneaky)


@pytest.mark.parametrize(
    "location",
    ["file:///wh/db/orders/data/_eo/../../metadata", "s3://bucket/wh/orders/..", "C:\\wh\\orders\\..\\x"],
)
def test_a_write_location_that_climbs_out_of_its_folder_is_refused(location: str) -> None:
    """An abort deletes everything below the location: ``..`` would point it elsewhere."""
    data = _valid(tables=[{"table": "db.orders", "location": location}])
    with pytest.raises(InvalidPreCommit, match=r"tables\.0\.location: .* holds a '\.\.' segment"):
        PreCommit.parse(data)
    assert PreCommit.parse(_valid(tables=[{"table": "db.orders", "location": "s3://b/a..b/w1"}])).tables


ENDLESS = {"kind": "iceberg_snapshots", "table": "up.events", "after_snapshot_id": 5}


@pytest.mark.parametrize(
    ("positions", "fault"),
    [
        (ENDLESS, "range of up.events: it starts after snapshot 5 and ends nowhere"),
        ({**ENDLESS, "to_snapshot_id": 2**70}, "to_snapshot_id: Input should be less than or equal to"),
        (
            {**ENDLESS, "after_snapshot_id": True, "to_snapshot_id": 9},
            "after_snapshot_id: Input should be a valid integer",
        ),
        ({"kind": "iceberg_snapshots", "to_snapshot_id": 9}, "table: Input should be a valid string"),
        ({**ENDLESS, "table": "up.t\x1b]0;x\x07", "to_snapshot_id": 9}, "table: 'up.t.*holds the control character"),
    ],
)
def test_a_consumed_range_that_does_not_parse_is_refused_where_a_write_enters(
    positions: dict[str, object], fault: str
) -> None:
    """Whether it arrives as a dict (XCom), as JSON text (the pre-commit file) or compressed; a row
    read back from the meta store keeps what it holds (its commit refuses it, its abort works)."""
    data = _valid(source_positions=positions)
    named = (
        rf"invalid pre-commit metadata: source_positions: kind 'iceberg_snapshots' but no snapshot range \(.*{fault}"
    )
    for given in (data, json.dumps(data)):
        with pytest.raises(InvalidPreCommit, match=named):
            PreCommit.parse(given)
    stored = PreCommit.parse(json.dumps(data), recorded=True)
    assert stored.source_positions == positions
    with pytest.raises(InvalidPreCommit, match=named.removeprefix("invalid pre-commit metadata: ")):
        stored.as_written()  # persist's check of a model it was handed
    with pytest.raises(InvalidPreCommit, match=named):
        PreCommit.parse(stored.to_compressed())
    fine = {**ENDLESS, "to_snapshot_id": 9, "files": 2}
    assert PreCommit.parse(_valid(source_positions=fine)).source_positions == fine


def test_duplicates_and_required_added_columns_are_refused() -> None:
    twice = _valid()
    files = twice["tables"][0]["data_files"]  # type: ignore[index]
    files.append(dict(files[0]))
    with pytest.raises(InvalidPreCommit, match="listed twice"):
        PreCommit.parse(twice)
    with pytest.raises(InvalidPreCommit, match="a table is listed twice"):
        PreCommit.parse(_valid(tables=[{"table": "t", "location": "/a"}, {"table": "t", "location": "/b"}]))
    added = _valid()
    added["tables"][0]["added_columns"] = [{"name": "c", "type": "string", "required": True}]  # type: ignore[index]
    with pytest.raises(InvalidPreCommit, match="added columns must be optional"):
        PreCommit.parse(added)


def test_bounds_must_be_base64() -> None:
    data = _valid()
    data["tables"][0]["data_files"][0]["lower_bounds"] = {"id": "***"}  # type: ignore[index]
    with pytest.raises(InvalidPreCommit, match="bound of column 'id' is not base64"):
        PreCommit.parse(data)


def test_a_trusted_parse_skips_only_the_checks_per_data_file() -> None:
    """The meta store's own deflated rows are parsed as trusted: what persist checked file by file is
    not checked again, but the structure and types are, and a table's rules are."""
    data = _valid()
    descriptor = data["tables"][0]["data_files"][0]  # type: ignore[index]
    descriptor["lower_bounds"] = {"id": "***"}
    descriptor["path"] = "file:///elsewhere/part\x1b[2J.parquet"
    text = json.dumps(data)
    with pytest.raises(
        InvalidPreCommit, match=r"path: contains the control character U.*; lower_bounds: bound of column 'id' is not"
    ):
        PreCommit.parse(text)
    trusted = PreCommit.parse(text, recorded=True, trusted=True)
    assert trusted.tables[0].data_files[0].lower_bounds == {"id": "***"}
    descriptor["lower_bounds"], descriptor["path"] = {}, "file:///elsewhere/part-0.parquet"
    with pytest.raises(InvalidPreCommit, match="outside the write location"):
        PreCommit.parse(json.dumps(data))
    assert PreCommit.parse(json.dumps(data), trusted=True).tables[0].data_files[0].path.startswith("file:///else")

    descriptor["record_count"] = "three"
    with pytest.raises(InvalidPreCommit, match="record_count"):
        PreCommit.parse(json.dumps(data), recorded=True, trusted=True)
    with pytest.raises(InvalidPreCommit, match="a table is listed twice"):
        PreCommit.parse(
            _valid(tables=[{"table": "t", "location": "/a"}, {"table": "t", "location": "/b"}]), trusted=True
        )


def test_models_are_immutable() -> None:
    pre = PreCommit.parse(_valid())
    with pytest.raises(Exception, match="frozen"):
        pre.epoch = 3  # type: ignore[misc]


def test_epoch_is_the_interval_start_in_milliseconds() -> None:
    start = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
    epoch = epoch_from_interval_start(start)
    assert epoch == int(start.timestamp() * 1000)
    assert epoch_start(epoch) == start
    same_instant = start.astimezone(timezone(timedelta(hours=5)))
    assert epoch_from_interval_start(same_instant) == epoch
    with pytest.raises(InvalidPreCommit, match="no time zone"):
        epoch_from_interval_start(datetime(2026, 1, 1))
    with pytest.raises(InvalidPreCommit, match="negative"):
        epoch_from_interval_start(datetime(1969, 12, 31, tzinfo=UTC))


def test_identifier_checks_accept_the_plain_cases() -> None:
    assert check_sink_id("orders_v2.daily-1") == "orders_v2.daily-1"
    assert check_epoch(0) == 0
