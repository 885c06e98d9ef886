"""``core.orphans.scan_orphans``: the one scan behind recovery, ``eo-sink gc`` and their dry runs, on a
listing and a registry of its own, so that what a failure turns into is seen without any storage."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from functools import partial

import pytest

from airflow_provider_exactly_once.core.cleanups import FileAge, WriteFolder, WriteLocation, scan_orphans
from airflow_provider_exactly_once.core.errors import MetaStoreUnavailable

GRACE = timedelta(hours=6)
NOW = datetime.now(UTC)
OLD, YOUNG, KNOWN = "a" * 32, "b" * 32, "c" * 32


class Listing:
    def __init__(self, ages: Mapping[str, datetime], fails_with: Exception | None = None) -> None:
        self._ages = ages
        self._fails_with = fails_with

    def folders(self) -> dict[str, list[WriteFolder]]:
        if self._fails_with is not None:
            raise self._fails_with
        return {
            write_id: [WriteFolder(WriteLocation("ns.t", f"s3://bkt/t/_eo/{write_id}"), partial(FileAge, 2, at, at))]
            for write_id, at in self._ages.items()
        }


class Registry:
    """Only what the scan asks: which write ids the store still answers for."""

    def __init__(self, known: set[str], fails: bool = False) -> None:
        self._known = known
        self._fails = fails

    def known_writes(self, sink_id: str, write_ids: Sequence[str]) -> set[str]:
        if self._fails:
            raise MetaStoreUnavailable("the meta store is down")
        return self._known & set(write_ids)


def test_old_orphans_go_young_ones_and_known_writes_stay() -> None:
    listing = Listing({OLD: NOW - 2 * GRACE, YOUNG: NOW - GRACE / 2, KNOWN: NOW - 2 * GRACE})
    old, young, failed = scan_orphans("s", listing, Registry({KNOWN}), GRACE)  # type: ignore[arg-type]
    assert ([c.write_id for c in old], [c.write_id for c in young], failed) == ([OLD], [YOUNG], None)
    assert old[0].sink_id == "s" and old[0].locations[0].location == f"s3://bkt/t/_eo/{OLD}"


def test_a_listing_that_fails_is_reported_with_its_secrets_masked_not_raised() -> None:
    listing = Listing({}, fails_with=OSError("cannot list s3://AKIA:s3cr3t@bkt/t/_eo"))
    assert scan_orphans("s", listing, Registry(set()), GRACE) == (  # type: ignore[arg-type]
        [],
        [],
        "sink 's': OSError: cannot list s3://AKIA:***@bkt/t/_eo",
    )


def test_an_unreachable_meta_store_is_raised_nothing_can_go_on() -> None:
    with pytest.raises(MetaStoreUnavailable):
        scan_orphans("s", Listing({OLD: NOW - 2 * GRACE}), Registry(set(), fails=True), GRACE)  # type: ignore[arg-type]
