"""The view's JSON API on a real API server: who may read, who may act, and what the actions do.

The auth manager is Airflow's SimpleAuthManager: a VIEWER may read DAGs, a USER may also edit
them, an ADMIN may do anything. The view must leave every decision to it.
"""

from __future__ import annotations

import httpx
import pytest

from airflow_provider_exactly_once.plugins import ExactlyOncePlugin, urls
from tests.plugins.ui.conftest import BASE, DAG_ID, OTHER_SINK, SINK, ApiServer, Epochs, json_of
from tests.support.pipeline import write_location_exists

ACTIONS = {"abort": {"reason": "test"}, "commit": {}, "cleanup": {}}


def _action(client: httpx.Client, action: str, epoch: int, sink_id: str = SINK, **body: object) -> httpx.Response:
    return client.post(f"/api/sinks/{sink_id}/epochs/{epoch}/{action}", json={**ACTIONS[action], **body})


def test_without_a_token_the_api_answers_401_and_pages_send_to_the_login(api_server: ApiServer) -> None:
    with api_server.client() as anonymous:
        for path in ("/api/sinks", "/api/epochs", f"/api/sinks/{SINK}/epochs/{Epochs.COMMITTED}"):
            assert anonymous.get(path).status_code == 401, path
        for action in ACTIONS:
            response = _action(anonymous, action, Epochs.WAITING_API)
            assert response.status_code == 401, (action, response.text)
        page = anonymous.get("/", follow_redirects=False)
        assert page.status_code == 303
        assert "/auth/login" in page.headers["location"] and "next=" in page.headers["location"]
    assert api_server.world.status(Epochs.WAITING_API) == "Pending"


def test_the_plugin_serves_every_url_of_the_url_contract(api_server: ApiServer) -> None:
    """``observability/urls.py`` builds every link to the view (the nav entry, the operators' extra links)."""
    [app] = ExactlyOncePlugin.fastapi_apps
    [view] = ExactlyOncePlugin.external_views
    assert app["url_prefix"] == urls.URL_PREFIX
    assert (view["url_route"], view["href"]) == (urls.UI_ROUTE, urls.sinks_page())
    headers = {"Authorization": f"Bearer {api_server.token('viewer')}"}
    for url in (
        urls.sinks_page(api_server.url),
        urls.sinks_page(api_server.url, sink_id=SINK, status="Pending"),
        urls.epoch_page(SINK, Epochs.COMMITTED, api_server.url),
    ):
        response = httpx.get(url, headers=headers, timeout=60)
        assert response.status_code == 200 and "text/html" in response.headers["content-type"], url
    # The API server itself lists the view among the UI's plugin entries (what the nav is built from).
    plugins = httpx.get(f"{api_server.url}/api/v2/plugins", headers=headers, timeout=60).json()["plugins"]
    [ours] = [p for p in plugins if p["name"] == ExactlyOncePlugin.name]
    assert [v["url_route"] for v in ours["external_views"]] == [urls.UI_ROUTE]


def test_a_forged_token_is_refused(api_server: ApiServer) -> None:
    with httpx.Client(base_url=f"{api_server.url}/exactly-once", headers={"Authorization": "Bearer not.a.jwt"}) as c:
        assert c.get("/api/epochs").status_code == 403


def test_a_viewer_reads_sinks_epochs_and_one_epoch(api_server: ApiServer) -> None:
    with api_server.client("viewer") as viewer:
        sinks = {s["sink_id"]: s for s in json_of(viewer.get("/api/sinks"))}
        assert set(sinks) >= {SINK, OTHER_SINK}
        assert sinks[OTHER_SINK]["counts"] == {"pending": 0, "committed": 3, "aborted": 0}
        assert sinks[SINK]["kind"] == "iceberg" and sinks[SINK]["registered"] is True

        clicks = json_of(viewer.get("/api/epochs", params={"sink": OTHER_SINK}))
        assert {e["sink_id"] for e in clicks} == {OTHER_SINK} and len(clicks) == 3
        aborted = json_of(viewer.get("/api/epochs", params={"sink": SINK, "status": "Aborted"}))
        assert Epochs.ABORTED in {e["epoch"] for e in aborted}
        assert {e["status"] for e in aborted} == {"Aborted"}

        detail = json_of(viewer.get(f"/api/sinks/{SINK}/epochs/{Epochs.COMMITTED}"))
        epoch = detail["epoch"]
        assert (epoch["status"], epoch["dag_id"], epoch["run_id"], epoch["try_number"]) == (
            "Committed",
            DAG_ID,
            f"scheduled__{Epochs.COMMITTED}",
            1,
        )
        assert epoch["rows"] == 5 and epoch["files"] == 1
        snapshot = epoch["tables"][0]["snapshot"]
        assert snapshot == api_server.world.snapshots_with_marker(Epochs.COMMITTED)[0]
        assert detail["checkpoint"]["status"] == "COMPLETED"
        assert (detail["delivery"]["how"], detail["delivery"]["tables"]) == ("one table", 1)
        assert detail["can_edit"] is False

        failed = json_of(viewer.get(f"/api/sinks/{SINK}/epochs/{Epochs.CHECKPOINT_FAILED}"))
        assert failed["checkpoint"]["status"] == "FAILED"
        assert "landing job exited 1" in failed["epoch"]["error"]

        # An epoch written outside any DAG run needs read access to DAGs in general, which a viewer has.
        no_dag = json_of(viewer.get(f"/api/sinks/{SINK}/epochs/{Epochs.NO_DAG}"))
        assert no_dag["epoch"]["dag_id"] is None

        page = viewer.get("/", params={"sink": SINK, "status": "Pending"})
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
        assert str(Epochs.WAITING_API) in page.text and str(Epochs.COMMITTED) not in page.text


def test_a_viewer_is_refused_every_action(api_server: ApiServer) -> None:
    world = api_server.world
    cases = {"abort": Epochs.WAITING_API, "commit": Epochs.TO_COMMIT, "cleanup": Epochs.ABORTED}
    with api_server.client("viewer") as viewer:
        for action, epoch in cases.items():
            response = _action(viewer, action, epoch)
            assert response.status_code == 403, (action, response.text)
            assert "may not edit" in response.json()["detail"]
        # An unknown epoch is no way around it: a reader learns nothing from the actions.
        assert _action(viewer, "abort", 12345).status_code == 403
    assert world.status(Epochs.WAITING_API) == "Pending"
    assert world.status(Epochs.TO_COMMIT) == "Pending"
    assert write_location_exists(world.writes[Epochs.ABORTED])


def test_unknown_sink_and_epoch_are_404_with_the_message(api_server: ApiServer) -> None:
    with api_server.client("admin") as admin:
        missing = admin.get(f"/api/sinks/{SINK}/epochs/12345")
        assert missing.status_code == 404 and "12345" in missing.json()["detail"]
        assert admin.get("/api/sinks/no-such-sink/epochs/1").status_code == 404
        assert _action(admin, "commit", 12345).status_code == 404
        page = admin.get(f"/sinks/{SINK}/epochs/12345")
        assert page.status_code == 404 and "12345" in page.text


def test_bad_requests_name_what_is_wrong(api_server: ApiServer) -> None:
    with api_server.client("user") as user:
        bad = user.get("/api/epochs", params={"status": "Done"})
        assert bad.status_code == 400 and "'Done'" in bad.json()["detail"]
        empty_reason = _action(user, "abort", Epochs.WAITING_API, reason="")
        assert empty_reason.status_code == 422
        page = user.get("/", params={"status": "Done"})
        assert page.status_code == 400 and "text/html" in page.headers["content-type"] and "Done" in page.text
    assert api_server.world.status(Epochs.WAITING_API) == "Pending"


def test_actions_refuse_what_another_site_could_forge(api_server: ApiServer) -> None:
    url = f"/api/sinks/{SINK}/epochs/{Epochs.WAITING_API}/abort"
    with api_server.client("user") as user:
        form = user.post(url, data={"reason": "forged"})
        assert form.status_code == 415 and "application/json" in form.json()["detail"]
        cross = user.post(url, json={"reason": "forged"}, headers={"Origin": "http://evil.example"})
        assert cross.status_code == 403 and "evil.example" in cross.json()["detail"]
        site = user.post(url, json={"reason": "forged"}, headers={"Sec-Fetch-Site": "cross-site"})
        assert site.status_code == 403
        # Reading never changes anything, whatever the method asked for.
        assert user.get(url).status_code == 405
    assert api_server.world.status(Epochs.WAITING_API) == "Pending"


def test_abort_of_an_epoch_whose_checkpoint_completed_is_409_with_the_message(api_server: ApiServer) -> None:
    world = api_server.world
    with api_server.client("user") as user:
        response = _action(user, "abort", Epochs.ABORT_REFUSED)
    assert response.status_code == 409, response.text
    assert "checkpoint COMPLETED" in response.json()["detail"]
    assert world.status(Epochs.ABORT_REFUSED) == "Pending"
    assert write_location_exists(world.writes[Epochs.ABORT_REFUSED])


def test_retry_commit_makes_the_epoch_visible_exactly_once(api_server: ApiServer) -> None:
    world = api_server.world
    assert world.snapshots_with_marker(Epochs.TO_COMMIT) == []
    with api_server.client("user") as user:
        dry = json_of(_action(user, "commit", Epochs.TO_COMMIT, dry_run=True))
        assert dry["dry_run"] is True and world.status(Epochs.TO_COMMIT) == "Pending"
        first = _action(user, "commit", Epochs.TO_COMMIT)
        assert first.status_code == 200, first.text
        again = _action(user, "commit", Epochs.TO_COMMIT)
        assert again.status_code == 200, again.text
    assert first.json()["outcome"] != again.json()["outcome"]  # committed, then already committed
    assert world.status(Epochs.TO_COMMIT) == "Committed"
    assert len(world.snapshots_with_marker(Epochs.TO_COMMIT)) == 1
    visible = [r for r in world.pipeline.rows("orders") if r["epoch"] == Epochs.TO_COMMIT]
    assert len(visible) == 5 and {r["write_id"] for r in visible} == {world.writes[Epochs.TO_COMMIT].write_id}


@pytest.mark.parametrize("who", ["user", "admin"])
def test_users_who_may_edit_the_dag_act(api_server: ApiServer, who: str) -> None:
    world = api_server.world
    if who == "user":
        epoch, action, expected = Epochs.WAITING_API, "abort", "Aborted"
    else:
        epoch, action, expected = Epochs.ABORTED, "cleanup", "Aborted"
    assert write_location_exists(world.writes[epoch])
    markup = "<img src=x onerror=alert(1)>"
    with api_server.client(who) as client:
        response = _action(client, action, epoch, **({"reason": f"replayed {markup}"} if action == "abort" else {}))
        assert response.status_code == 200, response.text
        assert json_of(client.get(f"/api/sinks/{SINK}/epochs/{epoch}"))["can_edit"] is True
        if action == "abort":
            # The reason is kept on the row and shown on the page, as text: never as markup.
            page = client.get(f"/sinks/{SINK}/epochs/{epoch}").text
            assert "replayed &lt;img src=x onerror=alert(1)&gt;" in page and markup not in page
    assert response.json()["files_deleted"] >= 1
    assert world.status(epoch) == expected
    assert not write_location_exists(world.writes[epoch])
    assert world.snapshots_with_marker(epoch) == []


def test_the_epoch_page_lists_the_revisions_of_a_reprocessed_epoch(api_server: ApiServer) -> None:
    world = api_server.world
    with api_server.client("viewer") as viewer:
        detail = json_of(viewer.get(f"/api/sinks/{OTHER_SINK}/epochs/{BASE}"))["epoch"]
        assert (detail["status"], detail["write_id"], detail["revision"]) == ("Committed", world.replacing, 1)
        assert [(r["write_id"], r["status"]) for r in detail["revisions"]] == [
            (world.replaced, "Replaced"),
            (world.replacing, "Committed"),
        ]
        page = viewer.get(f"/sinks/{OTHER_SINK}/epochs/{BASE}")
        assert page.status_code == 200 and 'id="revisions"' in page.text
        assert world.replaced in page.text and world.replacing in page.text and "Replaced" in page.text
