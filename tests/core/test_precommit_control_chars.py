"""Control characters in a pre-commit's paths and names are refused where the metadata enters.

A data-file path, a table name or a write location is printed by ``eo-sink`` and logged; one holding
``ESC ] 0 ; ... BEL`` would retitle (or clear) the operator's terminal. No real path holds one.
"""

from __future__ import annotations

import base64
import json
import uuid
import zlib

import pytest

from airflow_provider_exactly_once.core.errors import InvalidPreCommit
from airflow_provider_exactly_once.core.precommit import COMPRESSED_PREFIX, PreCommit

LOCATION = "file:///wh/db/orders/data/_eo/w1"

#: ESC, BEL, CR, LF, NUL, DEL, and the C1 controls CSI (U+009B) and NEL (U+0085).
CONTROLS = ["\x1b", "\x07", "\r", "\n", "\x00", "\x7f", "\x9b", "\x85"]


def _data(*, path: str = f"{LOCATION}/part-0.parquet", table: str = "db.orders", location: str = LOCATION) -> str:
    return json.dumps(
        {
            "sink_id": "orders",
            "epoch": 1_700_000_000_000,
            "write_id": str(uuid.uuid4()),
            "tables": [
                {
                    "table": table,
                    "location": location,
                    "data_files": [{"path": path, "record_count": 1, "file_size_in_bytes": 10}],
                }
            ],
        }
    )


@pytest.mark.parametrize("control", CONTROLS, ids=[f"U+{ord(c):04X}" for c in CONTROLS])
@pytest.mark.parametrize("field", ["path", "table", "location"])
def test_a_control_character_is_refused_naming_the_field(field: str, control: str) -> None:
    if field == "path":
        data = _data(path=f"{LOCATION}/part{control}0.parquet")
    elif field == "table":
        data = _data(table=f"db.ord{control}ers")
    else:
        data = _data(location=f"{LOCATION}{control}x", path=f"{LOCATION}{control}x/part-0.parquet")
    with pytest.raises(InvalidPreCommit) as raised:
        PreCommit.parse(data)
    message = str(raised.value)
    assert f"{field}: " in message and f"U+{ord(control):04X}" in message, message
    assert control not in message  # the message names the character, it does not carry it


def test_printable_unicode_paths_and_names_are_accepted() -> None:
    """Only controls are refused: a path in another script, or with spaces and tabs' printable kin, is fine."""
    location = "file:///wh/données/日付=2026-01-01/_eo/w1"
    pre = PreCommit.parse(_data(path=f"{location}/part 0 ü.parquet", table="db.ördérs", location=location))
    assert pre.tables[0].data_files[0].path.endswith("part 0 ü.parquet")


def test_the_compressed_form_is_held_to_the_same_rule() -> None:
    """XCom carries the compressed form; a forged one (the escape as JSON's ``\\u001b``) is refused too."""
    forged = _data().replace("part-0.parquet", "part-\\u001b]0;owned\\u00070.parquet")
    assert "\x1b" not in forged and "\x1b" in json.loads(forged)["tables"][0]["data_files"][0]["path"]
    compressed = COMPRESSED_PREFIX + base64.b64encode(zlib.compress(forged.encode())).decode("ascii")
    with pytest.raises(InvalidPreCommit, match="U\\+001B"):
        PreCommit.parse(compressed)
    assert PreCommit.parse(PreCommit.parse(_data()).to_compressed()).tables[0].table == "db.orders"
