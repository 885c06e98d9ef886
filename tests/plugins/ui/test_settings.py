"""``[exactly_once] sink_listing`` and ``stale_run_minutes``: read from Airflow's configuration,
refused by name when invalid."""

from __future__ import annotations

from datetime import timedelta

import pytest

from airflow_provider_exactly_once.core.errors import InvalidSinkConfig
from airflow_provider_exactly_once.plugins.ui.app import sink_listing, stale_run_threshold


@pytest.mark.parametrize(("value", "expected"), [(None, "per_dag"), ("per_dag", "per_dag"), (" ALL ", "all")])
def test_the_sink_listing_setting(monkeypatch: pytest.MonkeyPatch, value: str | None, expected: str) -> None:
    if value is None:
        monkeypatch.delenv("AIRFLOW__EXACTLY_ONCE__SINK_LISTING", raising=False)
    else:
        monkeypatch.setenv("AIRFLOW__EXACTLY_ONCE__SINK_LISTING", value)
    assert sink_listing() == expected


def test_an_unknown_sink_listing_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__EXACTLY_ONCE__SINK_LISTING", "everyone")
    with pytest.raises(InvalidSinkConfig, match=r"sink_listing = 'everyone'; one of \['per_dag', 'all'\]"):
        sink_listing()


@pytest.mark.parametrize(("value", "minutes"), [(None, 60.0), ("15", 15.0), (" 2.5 ", 2.5)])
def test_the_stale_run_threshold_setting(monkeypatch: pytest.MonkeyPatch, value: str | None, minutes: float) -> None:
    if value is None:
        monkeypatch.delenv("AIRFLOW__EXACTLY_ONCE__STALE_RUN_MINUTES", raising=False)
    else:
        monkeypatch.setenv("AIRFLOW__EXACTLY_ONCE__STALE_RUN_MINUTES", value)
    assert stale_run_threshold() == timedelta(minutes=minutes)


def test_a_stale_run_threshold_that_is_no_duration_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__EXACTLY_ONCE__STALE_RUN_MINUTES", "-1")
    with pytest.raises(InvalidSinkConfig, match=r"\[exactly_once\] stale_run_minutes = '-1': give a number of minutes"):
        stale_run_threshold()
