"""``[exactly_once] sink_listing``: read from Airflow's configuration, refused by name when unknown."""

from __future__ import annotations

import pytest

from airflow_provider_exactly_once.core.errors import InvalidSinkConfig
from airflow_provider_exactly_once.plugins.ui.app import sink_listing


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
