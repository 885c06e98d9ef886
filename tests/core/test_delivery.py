"""``core.delivery``: the line the epoch views print, and credentials masked as the value is made."""

from __future__ import annotations

import json

import pytest

from airflow_provider_exactly_once.core.delivery import Delivery, EpochDelivery, unknown


def test_each_kind_says_how_many_tables_whether_atomic_and_why() -> None:
    together = EpochDelivery(
        how=Delivery.ONE_TRANSACTION, tables=3, why="SQL catalog 'lake' moves every pointer at once"
    )
    assert (
        together.text
        == "atomic across its 3 tables, one catalog transaction (SQL catalog 'lake' moves every pointer at once)"
    )
    asked = EpochDelivery(how=Delivery.ONE_REQUEST, tables=2, why="REST catalog 'r' does not list the route")
    assert asked.text == (
        "one catalog request across its 2 tables, atomic only if the catalog applies it so: "
        "REST catalog 'r' does not list the route"
    )
    apart = EpochDelivery(how=Delivery.TABLE_BY_TABLE, tables=2, why="catalog 'c' is a Glue catalog")
    assert apart.text == "not atomic across its 2 tables, committed table by table: catalog 'c' is a Glue catalog"
    assert EpochDelivery(how=Delivery.ONE_TABLE, tables=1, why="one snapshot").text == "one table: one snapshot"
    assert [d.atomic for d in (together, asked, apart, EpochDelivery(how=Delivery.ONE_TABLE, tables=1, why="one"))] == [
        True,
        None,
        False,
        True,
    ]
    assert json.loads(json.dumps(apart.model_dump(mode="json"))) == {
        "how": "table by table",
        "tables": 2,
        "atomic": False,
        "why": "catalog 'c' is a Glue catalog",
        "text": apart.text,
    }


def test_an_unknown_answer_names_the_error_on_one_line_with_credentials_masked() -> None:
    error = ConnectionError("postgresql://eo:Planted-pw@db:5432/catalog refused\n  traceback detail")
    found = unknown(2, error)
    assert found.how is Delivery.UNKNOWN and found.tables == 2
    assert found.why == "ConnectionError: postgresql://eo:***@db:5432/catalog refused"
    assert "Planted-pw" not in json.dumps(found.model_dump(mode="json"))


def test_a_sink_of_no_table_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one table"):
        EpochDelivery(how=Delivery.ONE_TABLE, tables=0, why="none")
