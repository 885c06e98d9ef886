"""An audited sink's epochs in the view (design.md D23, issue 58), on the real API server: the API and
the epoch page show each epoch's audit, the history colours its verdict, the sink picture its stage,
and an epoch whose audit failed is rejected from the page's Actions, as an abort is, with the same
checks. The epochs are audited by a real coordinator onto audit branches of a real table."""

from __future__ import annotations

import re

import httpx

from airflow_provider_exactly_once.sinks.iceberg.markers import audit_branch_name
from tests.plugins.ui.conftest import AUDITED_SINK, CHECK_MARKUP, SINK, ApiServer, Audited, Epochs, json_of
from tests.support.independent_reader import read_branch
from tests.support.pipeline import write_location_exists


def _reject(client: httpx.Client, epoch: int, **body: object) -> httpx.Response:
    return client.post(f"/api/sinks/{AUDITED_SINK}/epochs/{epoch}/reject", json={"reason": "bad rows", **body})


def _refs(api_server: ApiServer) -> set[str]:
    world = api_server.world
    return set(world.pipeline.catalog.load_table(f"{world.pipeline.namespace}.{AUDITED_SINK}").metadata.refs)


def test_the_api_shows_each_epochs_audit_and_none_for_an_epoch_of_no_audit(api_server: ApiServer) -> None:
    stages = {
        Audited.PUBLISHED: ("Committed", "Committed", "passed"),
        Audited.AUDITING: ("Pending", "Auditing", None),
        Audited.AUDITED: ("Pending", "Audited", "passed"),
        Audited.FAILED: ("Pending", "Audit failed", "failed"),
    }
    refs = _refs(api_server)
    with api_server.client("viewer") as viewer:
        for epoch, (status, stage, verdict) in stages.items():
            audit = json_of(viewer.get(f"/api/sinks/{AUDITED_SINK}/epochs/{epoch}"))["epoch"]["audit"]
            assert (audit["stage"], audit["verdict"]) == (stage, verdict), epoch
            assert audit["branch"] == audit_branch_name(AUDITED_SINK, epoch)
            assert (audit["branch"] in refs) is (status == "Pending")  # a publish removes the branch
            [(table, snapshot)] = audit["snapshots"].items()
            assert table.endswith(f".{AUDITED_SINK}") and snapshot.isdigit()
        failed = json_of(viewer.get(f"/api/sinks/{AUDITED_SINK}/epochs/{Audited.FAILED}"))["epoch"]["audit"]["failed"]
        assert failed == [{"name": name, "message": message} for name, message in Audited.FAILED_CHECKS]
        listed = {e["epoch"]: e for e in json_of(viewer.get("/api/epochs", params={"sink": AUDITED_SINK}))}
        assert listed[Audited.AUDITING]["audit"]["stage"] == "Auditing"
        # Every epoch of a sink with no audit keeps its form: no "audit" key at all.
        plain = json_of(viewer.get(f"/api/sinks/{SINK}/epochs/{Epochs.COMMITTED}"))["epoch"]
        assert "audit" not in plain
        assert all("audit" not in e for e in json_of(viewer.get("/api/epochs", params={"sink": SINK})))


def test_the_epoch_page_shows_the_audit_and_offers_reject_only_when_it_failed(api_server: ApiServer) -> None:
    with api_server.client("user") as user:
        page = user.get(f"/sinks/{AUDITED_SINK}/epochs/{Audited.FAILED}").text
        assert 'id="audit" data-stage="Audit failed"' in page
        assert re.search(r'id="epoch-stage"[^>]*>Audit failed<', page)
        assert audit_branch_name(AUDITED_SINK, Audited.FAILED) in page
        for name, _ in Audited.FAILED_CHECKS:
            assert f'data-check="{name}"' in page
        assert 'data-check="row_count"' not in page  # a passed check is no failure
        assert "3 rows break the check &lt;img src=x onerror=alert(2)" in page and CHECK_MARKUP not in page
        assert 'id="reject-button"' in page and 'id="reject-dialog"' in page and 'id="abort-button"' in page
        assert 'data-action="commit"' not in page  # a publish would be refused: its audit failed
        # The history colours the verdict: its class is the event's, as a commit's is.
        assert re.search(r'class="event event-audit-failed" data-event="audit failed"', page)
        assert re.search(r'class="event event-audit-committed" data-event="audit committed"', page)

        auditing = user.get(f"/sinks/{AUDITED_SINK}/epochs/{Audited.AUDITING}").text
        assert 'data-stage="Auditing"' in auditing and "not judged yet" in auditing
        assert 'id="reject-button"' not in auditing and 'id="reject-dialog"' not in auditing
        assert 'data-action="commit"' not in auditing and 'id="audit-failed"' not in auditing

        audited = user.get(f"/sinks/{AUDITED_SINK}/epochs/{Audited.AUDITED}").text
        assert 'id="reject-button"' not in audited and ">Retry publish<" in audited
        assert 'class="event event-audit-passed" data-event="audit passed"' in audited

        published = user.get(f"/sinks/{AUDITED_SINK}/epochs/{Audited.PUBLISHED}").text
        assert 'data-stage="Committed"' in published and "removed once the epoch settled" in published
        assert 'id="epoch-stage"' not in published and 'id="reject-button"' not in published

        plain = user.get(f"/sinks/{SINK}/epochs/{Epochs.WAITING_API}").text
        assert 'id="audit"' not in plain and 'id="reject-button"' not in plain and 'data-action="commit"' not in plain

    with api_server.client("viewer") as viewer:  # a reader sees the audit and no action
        page = viewer.get(f"/sinks/{AUDITED_SINK}/epochs/{Audited.FAILED}").text
        assert 'id="audit"' in page and 'id="reject-button"' not in page


def test_reject_is_refused_to_a_viewer_and_for_an_audit_that_did_not_fail(api_server: ApiServer) -> None:
    world = api_server.world
    with api_server.client("viewer") as viewer:
        refused = _reject(viewer, Audited.FAILED)
        assert refused.status_code == 403 and "may not edit" in refused.json()["detail"]
        assert _reject(viewer, 12345).status_code == 403  # an unknown epoch tells a reader nothing
    with api_server.client("user") as user:
        for epoch, stage in ((Audited.AUDITING, "Auditing"), (Audited.AUDITED, "Audited")):
            dry = json_of(_reject(user, epoch, dry_run=True))
            assert (dry["dry_run"], dry["outcome"]) == (True, f"refused: the epoch is {stage}")
            response = _reject(user, epoch)
            assert response.status_code == 409, response.text
            assert "only a write whose audit failed is rejected" in response.json()["detail"]
        assert _reject(user, Audited.PUBLISHED).status_code == 409
        plain = user.post(f"/api/sinks/{SINK}/epochs/{Epochs.NO_DAG}/reject", json={"reason": "x"})
        assert plain.status_code == 409 and "abort it instead" in plain.json()["detail"]  # a sink of no audit
        assert _reject(user, Audited.FAILED, reason="").status_code == 422
        forged = user.post(
            f"/api/sinks/{AUDITED_SINK}/epochs/{Audited.FAILED}/reject",
            json={"reason": "forged"},
            headers={"Origin": "http://evil.example"},
        )
        assert forged.status_code == 403
    for epoch in (Audited.AUDITING, Audited.AUDITED, Audited.FAILED):
        assert world.status(epoch, AUDITED_SINK) == "Pending"
        assert write_location_exists(world.audited_writes[epoch])
    assert world.status(Epochs.NO_DAG) == "Pending"


def test_a_user_rejects_an_epoch_whose_audit_failed(api_server: ApiServer) -> None:
    world, epoch = api_server.world, Audited.FAILED_API
    branch = audit_branch_name(AUDITED_SINK, epoch)
    assert branch in _refs(api_server)
    with api_server.client("user") as user:
        dry = json_of(_reject(user, epoch, dry_run=True))
        assert (dry["dry_run"], dry["outcome"]) == (True, "would reject")
        assert "failed checks: no_null_ids: 3 rows break the check" in dry["detail"]
        assert world.status(epoch, AUDITED_SINK) == "Pending" and branch in _refs(api_server)
        response = _reject(user, epoch, reason="the audit found null ids")
        assert response.status_code == 200, response.text
        assert (response.json()["action"], response.json()["outcome"]) == ("reject", "aborted")
        detail = json_of(user.get(f"/api/sinks/{AUDITED_SINK}/epochs/{epoch}"))
        again = _reject(user, epoch)
    assert again.status_code == 409  # an Aborted epoch is rejected once
    row = detail["epoch"]
    assert row["status"] == "Aborted" and row["audit"]["stage"] == "Aborted"
    assert "the audit found null ids (by user in the sink-state view)" in row["error"]
    events = [(e["event"], e["actor"]) for e in detail["history"]]
    assert [event for event, _ in events][:4] == ["persisted", "audit committed", "audit failed", "aborted"]
    assert events[3] == ("aborted", "ui")
    assert world.status(epoch, AUDITED_SINK) == "Aborted"
    assert not write_location_exists(world.audited_writes[epoch])
    assert branch not in _refs(api_server)
    table = world.pipeline.catalog.load_table(f"{world.pipeline.namespace}.{AUDITED_SINK}")
    assert {epoch for (epoch,) in read_branch(table, "main", "epoch")} == {Audited.PUBLISHED}  # read by DuckDB


def test_the_sink_picture_colours_an_audited_pending_epoch_by_its_stage(api_server: ApiServer) -> None:
    with api_server.client("viewer") as viewer:
        page = viewer.get("/", params={"sink": AUDITED_SINK}).text
    shapes = [
        dict(re.findall(r'([\w-]+)="([^"]*)"', mark)) for mark in re.findall(r'<rect [^>]*class="mark"[^>]*/>', page)
    ]
    marks = {int(m["data-epoch"]): {k.removeprefix("data-"): v for k, v in m.items()} for m in shapes}
    assert marks[Audited.AUDITING].get("stage") == "Auditing"
    assert marks[Audited.AUDITED].get("stage") == "Audited"
    assert marks[Audited.FAILED].get("stage") == "Audit failed"
    assert "stage" not in marks[Audited.PUBLISHED]
    fills = {epoch: m["fill"] for epoch, m in marks.items()}
    assert fills[Audited.AUDITING] == fills[Audited.AUDITED] != fills[Audited.FAILED]
    assert fills[Audited.FAILED] not in (fills[Audited.PUBLISHED], "#d97706", "#dc2626")
    assert "Pending (Audit failed)" in page and "failed check no_null_ids" in page
    assert 'class="badge badge-audit-failed stage">Audit failed<' in page  # the epoch list says it too
