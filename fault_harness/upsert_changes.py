"""The upsert pipeline's input: per hour, a batch of changes by key, and the model they add up to.

Both sides read it: the light upsert writer (``upsert_writer``) applies an hour's changes to the
table, the checker (``upsert_checker``) applies every checkpointed hour's changes to a plain dict and
compares. They share only this module's reading of the files (``read_changes``, ``last_per_key``),
which follows the sink's rules (``core.upserts.UpsertSpec``): operation values compared as text,
the greatest ``seq`` wins among two changes of one key, a tie is refused.

The changes are drawn from a pool of a few dozen keys, so that most hours update and delete rows
earlier hours inserted (and now and then insert again a key an earlier hour deleted); two keys per
hour change twice, the losing change placed *after* the winning one in file order, so a writer that
took the last line instead of the greatest ``seq`` would be caught.
"""

from __future__ import annotations

import datetime as dt
import json
import random
from collections.abc import Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from airflow_provider_exactly_once.core.upserts import UpsertSpec
from demo.world import hour_dir
from fault_harness.landed import Row, row_of_event

KEY, OP_COLUMN, ORDER_BY = "event_id", "op", "seq"
#: The sink's settings (``IcebergSinkConfig(upsert=SPEC)`` in ``upsert_pipeline.upsert_sink``).
SPEC = UpsertSpec(key=(KEY,), op_column=OP_COLUMN, order_by=ORDER_BY)
#: Keys an hour's changes are drawn from, and changes per hour (before the repeated ones).
KEY_POOL = 40
CHANGES_PER_HOUR = 12
#: Keys per hour that change twice (an earlier, losing change beside the final one).
REPEATED_PER_HOUR = 2
EVENT_TYPES = ("view", "click", "purchase", "refund")


@dataclass(frozen=True)
class Change:
    """One change row as landed: its key, what it does, its order within the hour and the row it sets."""

    key: str
    op: Literal["upsert", "delete"]
    seq: int
    #: The row as the table would hold it (``landed.Row``); a delete's carries whatever was landed.
    row: Row


def key_name(k: int) -> str:
    return f"k{k:03d}"


def hour_changes(name: str, n: int, hour: dt.datetime) -> list[dict[str, Any]]:
    """Hour ``n``'s change rows for pipeline ``name``, as JSON objects in file order; deterministic."""
    rng = random.Random(f"{name}-upsert-{n}")
    keys = rng.sample(range(KEY_POOL), CHANGES_PER_HOUR)
    ops = ["I" if n == 0 else rng.choices(("I", "U", "D"), (0.2, 0.5, 0.3))[0] for _ in keys]
    if "I" not in ops and "U" not in ops:
        ops[0] = "U"  # every hour writes something: its epoch has a snapshot to judge
    base = n * 1000 + 100

    def event(k: int, op: str, seq: int) -> dict[str, Any]:
        event_type = rng.choice(EVENT_TYPES)
        at = hour + dt.timedelta(seconds=rng.randrange(3600), microseconds=rng.randrange(1_000_000))
        return {
            KEY: key_name(k),
            "user_id": rng.randrange(1, 500),
            "event_type": event_type,
            "event_time": at.isoformat(),
            "amount": round(rng.uniform(1, 200), 2) if event_type in ("purchase", "refund") else None,
            OP_COLUMN: op,
            ORDER_BY: seq,
        }

    events = [event(k, op, base + i) for i, (k, op) in enumerate(zip(keys, ops, strict=True))]
    for i in rng.sample(range(len(keys)), REPEATED_PER_HOUR):
        # An earlier change of the same key, landed after the one that wins.
        events.append(event(keys[i], rng.choice(("U", "D")), base - 50 + i))
    return events


def land_changes(landing: Path, hour: dt.datetime, events: Iterable[Mapping[str, Any]], *, files: int = 2) -> None:
    """The hour's change rows as ``files`` JSON-lines files (the writer reads ``*.json``)."""
    directory = hour_dir(landing, hour)
    directory.mkdir(parents=True, exist_ok=True)
    chunks: list[list[str]] = [[] for _ in range(files)]
    for i, e in enumerate(events):
        chunks[i % files].append(json.dumps(e))
    for n, chunk in enumerate(chunks):
        (directory / f"changes-{n:03d}.json").write_text("\n".join(chunk) + "\n", encoding="utf-8")


def read_changes(directory: Path) -> list[Change]:
    """The change rows of the ``*.json`` files directly in ``directory``, in file order; an unknown
    operation or a missing ``seq`` is refused, as the sink refuses them."""
    changes: list[Change] = []
    for path in sorted(directory.glob("*.json")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            event = json.loads(line)
            op = SPEC.operation(str(event.get(OP_COLUMN)))
            if op is None or event.get(ORDER_BY) is None or event.get(KEY) is None:
                raise ValueError(f"{path}: not a change row of the upsert pipeline: {line}")
            changes.append(Change(str(event[KEY]), op, int(event[ORDER_BY]), row_of_event(event)))
    return changes


def last_per_key(changes: Iterable[Change]) -> dict[str, Change]:
    """One change per key, the greatest ``seq`` (the sink's ``order_by`` rule); a tie is refused."""
    last: dict[str, Change] = {}
    for change in changes:
        seen = last.get(change.key)
        if seen is not None and seen.seq == change.seq:
            raise ValueError(f"key {change.key!r} changes twice with seq {change.seq}")
        if seen is None or change.seq > seen.seq:
            last[change.key] = change
    return last


def apply(model: MutableMapping[str, Row], changes: Mapping[str, Change]) -> None:
    """The hour's changes (one per key) applied to ``model`` (key -> row): upserts set, deletes remove."""
    for key, change in changes.items():
        if change.op == "delete":
            model.pop(key, None)
        else:
            model[key] = change.row
