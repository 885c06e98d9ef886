"""What an operator reads about an upsert epoch: rows inserted, updated and deleted and the files
rewritten per table, in the epoch's view (``eo-sink show``, the UI's API) and on its UI page."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import airflow_provider_exactly_once.plugins.ui as ui_package
from airflow_provider_exactly_once.core.delivery import Delivery, EpochDelivery
from airflow_provider_exactly_once.core.epochs import EpochStatus
from airflow_provider_exactly_once.core.upserts import ChangeCounts, RewrittenFile
from airflow_provider_exactly_once.operations.views import EpochView
from airflow_provider_exactly_once.plugins.ui.render import templates_for
from tests.core.test_decisions import row, write


def upsert_row() -> EpochView:
    pre = write("db.accounts", "db.audit")
    accounts, audit = pre.tables
    accounts = accounts.model_copy(
        update={
            "changes": ChangeCounts(inserted=3, updated=2, deleted=1, deletes_of_absent_keys=4),
            "rewritten": [RewrittenFile(path="file:///lake/db/accounts/data/old.parquet", record_count=10)],
        }
    )
    record = row(EpochStatus.COMMITTED, pre.model_copy(update={"tables": [accounts, audit]}))
    return EpochView.of(record, now=datetime(2024, 6, 1, 2, tzinfo=UTC))


def test_the_view_counts_an_upsert_tables_changes_and_an_append_tables_none() -> None:
    view = upsert_row().model_dump(mode="json")
    accounts, audit = view["tables"]
    assert accounts["changes"] == {
        "inserted": 3,
        "updated": 2,
        "deleted": 1,
        "deletes_of_absent_keys": 4,
        "files_rewritten": 1,
    }
    assert audit["changes"] is None


def test_the_epoch_page_shows_the_changes_table_only_for_upsert_writes() -> None:
    templates = templates_for(str(Path(ui_package.__file__).parent / "templates"))
    template = templates.env.get_template("epoch.html")
    context = {"user": "u", "checkpoint": {"status": "COMPLETED"}, "can_edit": False, "run_url": None}
    context |= {"home": "/", "sink_url": "/s", "api": "/api", "request": None}
    context["delivery"] = EpochDelivery(
        how=Delivery.TABLE_BY_TABLE, tables=2, why="catalog 'c' is a SQL catalog"
    ).model_dump(mode="json")
    page = template.render(row=upsert_row().model_dump(mode="json"), **context)
    changes = page.split('id="upsert-changes"', 1)[1].split("</table>", 1)[0]
    assert "db.accounts" in changes and "db.audit" not in changes
    assert [cell.split("<", 1)[0] for cell in changes.split('<td class="num">')[1:]] == ["3", "2", "1", "4", "1"]
    append_only = upsert_row().model_dump(mode="json")
    for table in append_only["tables"]:
        table["changes"] = None
    assert 'id="upsert-changes"' not in template.render(row=append_only, **context)
