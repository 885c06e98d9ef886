"""The view as an attacker or a careless operator meets it, on the real API server.

A user granted one DAG only (``auth_manager.PerDagAuthManager``), existence probes, credentials
planted in a sink's root, checkpoint path, error text and catalog URI, a catalog that is down,
malformed arguments, and the headers every page carries.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser

import httpx
import pytest

from tests.plugins.ui.conftest import (
    BROKEN_EPOCH,
    BROKEN_SINK,
    DEAD_EPOCH,
    DEAD_SINK,
    ELSEWHERE_DAG,
    ELSEWHERE_NAMES,
    ELSEWHERE_RUNS,
    ELSEWHERE_TASK,
    LIMITED,
    MINE_DAG,
    MINE_EPOCHS,
    PAGED_SINK,
    PARTNER,
    PARTNER_DAG,
    PARTNER_RUN,
    SECRET_EPOCH,
    SECRET_SINK,
    SHARED_SINK,
    SINK,
    THEIRS_EPOCHS,
    ApiServer,
    Epochs,
    Shared,
    json_of,
)

EPOCH_MAX = 2**63 - 1


class _Scripts(HTMLParser):
    """Collects what a browser would run from the page itself: script elements without ``src`` and
    event-handler attributes (text that merely reads ``onerror=`` inside an attribute value is not one)."""

    def __init__(self) -> None:
        super().__init__()
        self.inline: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        names = {name for name, _ in attrs}
        if tag == "script" and "src" not in names:
            self.inline.append("<script> without src")
        self.inline.extend(f"<{tag} {name}=...>" for name in names if name.startswith("on"))


def _inline_script(page: str) -> list[str]:
    parser = _Scripts()
    parser.feed(page)
    return parser.inline


def _post(client: httpx.Client, sink_id: str, epoch: object, action: str, body: dict[str, object]) -> httpx.Response:
    return client.post(f"/api/sinks/{sink_id}/epochs/{epoch}/{action}", json=body)


# -- 1. per-DAG filtering before the page limit ------------------------------------------------------


def test_a_user_allowed_some_dags_sees_full_pages_of_exactly_their_epochs(api_server: ApiServer) -> None:
    mine = sorted(MINE_EPOCHS, reverse=True)
    with api_server.client(LIMITED) as limited:
        first = json_of(limited.get("/api/epochs", params={"sink": PAGED_SINK, "limit": 100}))
        second = json_of(limited.get("/api/epochs", params={"sink": PAGED_SINK, "limit": 100, "offset": 100}))
        assert [e["epoch"] for e in first] == mine[:100]
        assert [e["epoch"] for e in second] == mine[100:]
        # Across every sink: only epochs of the one DAG, none written outside a DAG run.
        everything = json_of(limited.get("/api/epochs", params={"limit": 1000}))
        assert {e["dag_id"] for e in everything} == {MINE_DAG} and len(everything) == len(mine)

        page = limited.get("/")
        assert page.status_code == 200, page.text
        shown = [int(n) for n in re.findall(r'data-epoch="(\d+)"', page.text)]
        assert shown == mine[:100]
        assert "No epoch matches" not in page.text and "offset=100" in page.text  # a full page and a way on
        older = limited.get("/", params={"offset": 100})
        assert [int(n) for n in re.findall(r'data-epoch="(\d+)"', older.text)] == mine[100:]
        assert "offset=200" not in older.text

        # The sinks: only the one with epochs of their DAG, counted over those epochs only.
        sinks = json_of(limited.get("/api/sinks"))
        assert [s["sink_id"] for s in sinks] == [PAGED_SINK]
        assert sinks[0]["counts"] == {"pending": len(mine), "committed": 0, "aborted": 0}
        assert 'data-sink="' + SINK + '"' not in page.text and SECRET_SINK not in page.text

        # The one epoch of theirs that exists reads like one that does not (see the probe test), and
        # acting on one of their own is allowed.
        dry = _post(limited, PAGED_SINK, mine[0], "abort", {"reason": "r", "dry_run": True})
        assert dry.status_code == 200 and dry.json()["outcome"] == "would abort", dry.text

    with api_server.client("admin") as admin:
        [paged] = [s for s in json_of(admin.get("/api/sinks")) if s["sink_id"] == PAGED_SINK]
        assert paged["counts"]["pending"] == len(MINE_EPOCHS) + len(THEIRS_EPOCHS)
        assert [e["epoch"] for e in json_of(admin.get("/api/epochs", params={"sink": PAGED_SINK, "limit": 3}))] == [
            250,
            249,
            248,
        ]


# -- 2. existence probes ------------------------------------------------------------------------------


def _same_answer(hidden: httpx.Response, missing: httpx.Response, hidden_epoch: int, missing_epoch: int) -> None:
    assert hidden.status_code == missing.status_code
    assert dict(hidden.headers).get("content-type") == dict(missing.headers).get("content-type")
    assert hidden.text.replace(str(hidden_epoch), "N") == missing.text.replace(str(missing_epoch), "N")


def test_an_epoch_the_user_may_not_read_answers_as_a_missing_one(api_server: ApiServer) -> None:
    hidden, missing = max(THEIRS_EPOCHS), max(THEIRS_EPOCHS) + 1_000
    with api_server.client(LIMITED) as limited:
        for path in ("/api/sinks/{sink}/epochs/{epoch}", "/sinks/{sink}/epochs/{epoch}"):
            a = limited.get(path.format(sink=PAGED_SINK, epoch=hidden))
            b = limited.get(path.format(sink=PAGED_SINK, epoch=missing))
            assert a.status_code == 404, a.text
            _same_answer(a, b, hidden, missing)
            assert "eo_paged_theirs" not in a.text
        for action, body in (("abort", {"reason": "probe", "dry_run": True}), ("commit", {}), ("cleanup", {})):
            a = _post(limited, PAGED_SINK, hidden, action, body)
            b = _post(limited, PAGED_SINK, missing, action, body)
            assert a.status_code == 404, a.text
            _same_answer(a, b, hidden, missing)
        # Another sink's epoch (of a DAG they may not read) is no different.
        a = limited.get(f"/api/sinks/{SINK}/epochs/{Epochs.COMMITTED}")
        b = limited.get(f"/api/sinks/{SINK}/epochs/{Epochs.COMMITTED + 1}")
        _same_answer(a, b, Epochs.COMMITTED, Epochs.COMMITTED + 1)
    assert api_server.world.pipeline.store.get(PAGED_SINK, hidden).status.value == "Pending"  # type: ignore[union-attr]


def _shared_answers(client: httpx.Client) -> dict[str, httpx.Response]:
    """Every answer that shows the shared sink's epoch of the partner's DAG: its API and page, the
    epoch lists (API, the sink's page with its picture, every sink's page)."""
    answers = {
        path: client.get(path)
        for path in (
            f"/api/sinks/{SHARED_SINK}/epochs/{Shared.OWNED}",
            f"/sinks/{SHARED_SINK}/epochs/{Shared.OWNED}",
            f"/api/epochs?sink={SHARED_SINK}",
            f"/?sink={SHARED_SINK}",
            "/api/epochs?limit=1000",
            "/",
        )
    }
    for path, response in answers.items():
        assert response.status_code == 200, (path, response.text[:2000])
    return answers


def test_another_dags_traces_in_an_epoch_the_user_may_read_say_another_dag(api_server: ApiServer) -> None:
    """Issue 54: two DAGs write one sink; the epoch the partner's DAG holds keeps the other DAG's
    aborted write, its discarded late write and the warning naming it. The partner (granted their DAG
    only) reads what happened, by "another DAG", and never that DAG's id, task or runs; an admin reads them."""
    with api_server.client(PARTNER) as partner:
        answers = _shared_answers(partner)
        for path, response in answers.items():
            leaked = [name for name in ELSEWHERE_NAMES if name in response.text]
            assert not leaked, (path, leaked)
        detail = answers[f"/api/sinks/{SHARED_SINK}/epochs/{Shared.OWNED}"].json()
        row = detail["epoch"]
        assert (row["dag_id"], row["run_id"], row["status"]) == (PARTNER_DAG, PARTNER_RUN, "Committed")
        assert f"of DAG '{PARTNER_DAG}'; a write from another DAG was discarded" in row["warning"]
        events = detail["history"]
        theirs = [e for e in events if e["actor_name"] == "another DAG"]
        ours = [e for e in events if e["dag_id"] == PARTNER_DAG]
        # What happened stays, in order: the other DAG's write, its abort, ours replacing it, the late one.
        assert [e["event"] for e in events][:3] == ["persisted", "aborted", "replaced"]
        assert {e["event"] for e in theirs} >= {"persisted", "aborted", "warning", "clean-up queued"}
        assert all(e["run_id"] is None and e["dag_id"] == "another DAG" for e in theirs)
        assert all(e["reason"] in (None, "(not shown: written by a run of another DAG)") for e in theirs)
        assert {e["event"] for e in ours} >= {"replaced", "committed"}
        assert all(e["run_id"] == PARTNER_RUN and e["actor_name"] == f"{PARTNER_DAG}.load" for e in ours)
        [listed] = [e for e in answers[f"/api/epochs?sink={SHARED_SINK}"].json() if e["epoch"] == Shared.OWNED]
        assert listed["warning"] == row["warning"]
        page = answers[f"/?sink={SHARED_SINK}"].text
        assert 'id="epoch-chart"' in page and 'class="warned"' in page
        assert "a write from another DAG was discarded" in page  # the mark's tooltip
        # The other DAG's own epoch of the sink is still one that does not exist.
        hidden = partner.get(f"/api/sinks/{SHARED_SINK}/epochs/{Shared.THEIRS}")
        assert hidden.status_code == 404 and ELSEWHERE_DAG not in hidden.text

    with api_server.client("admin") as admin:
        answers = _shared_answers(admin)
        detail = answers[f"/api/sinks/{SHARED_SINK}/epochs/{Shared.OWNED}"].json()
        assert f"a write from DAG '{ELSEWHERE_DAG}' was discarded" in detail["epoch"]["warning"]
        names = {(e["actor_name"], e["run_id"]) for e in detail["history"]}
        assert {(f"{ELSEWHERE_DAG}.{ELSEWHERE_TASK}", run) for run in ELSEWHERE_RUNS[:2]} <= names
        for path in (f"/sinks/{SHARED_SINK}/epochs/{Shared.OWNED}", f"/?sink={SHARED_SINK}"):
            assert ELSEWHERE_DAG in answers[path].text, path
        assert ELSEWHERE_RUNS[0] in answers[f"/sinks/{SHARED_SINK}/epochs/{Shared.OWNED}"].text


# -- 3. credentials ---------------------------------------------------------------------------------


def test_no_answer_page_or_log_line_holds_a_planted_password(api_server: ApiServer) -> None:
    world = api_server.world
    seen: list[str] = []
    with api_server.client("admin") as admin:
        for path in (
            "/api/sinks",
            "/api/epochs?limit=1000",
            f"/api/sinks/{SECRET_SINK}/epochs/{SECRET_EPOCH}",
            "/",
            f"/?sink={SECRET_SINK}",
            f"/sinks/{SECRET_SINK}/epochs/{SECRET_EPOCH}",
            f"/api/sinks/{DEAD_SINK}/epochs/{DEAD_EPOCH}",
        ):
            response = admin.get(path)
            assert response.status_code == 200, (path, response.text)
            seen.append(response.text)
        [exports] = [s for s in json_of(admin.get("/api/sinks")) if s["sink_id"] == SECRET_SINK]
        assert exports["root"] == "s3://AKIAEXAMPLE:***@bucket/exports"
        detail = json_of(admin.get(f"/api/sinks/{SECRET_SINK}/epochs/{SECRET_EPOCH}"))
        assert detail["epoch"]["tables"][0]["name"] == "s3://AKIAEXAMPLE:***@bucket/exports"
        assert "s3://AKIAEXAMPLE:***@bucket/exports/_eo/w1" in detail["epoch"]["error"]
        # The checkpoint path with credentials is refused when the source is rebuilt; the refusal masks it.
        assert "holds credentials" in detail["checkpoint"]["detail"] and "***" in detail["checkpoint"]["detail"]
        for action, body in (("abort", {"reason": "r", "dry_run": True}), ("commit", {"dry_run": True})):
            refused = _post(admin, SECRET_SINK, SECRET_EPOCH, action, body)
            assert refused.status_code == 400 and "storage_options" in refused.json()["detail"], refused.text
            seen.append(refused.text)
            down = _post(admin, DEAD_SINK, DEAD_EPOCH, action, body)
            assert down.status_code == 503, down.text
            seen.append(down.text)
    seen.append(api_server.log.read_text(errors="replace"))
    for text in seen:
        assert world.password not in text
    assert "AKIAEXAMPLE:***@" in "".join(seen)


# -- 4. an unreachable catalog ------------------------------------------------------------------------


def test_an_unreachable_catalog_is_503_naming_it_without_its_credentials(api_server: ApiServer) -> None:
    world = api_server.world
    with api_server.client("user") as user:
        for action, body in (
            ("commit", {"dry_run": True}),
            ("abort", {"reason": "catalog down", "dry_run": True}),
            ("cleanup", {}),
            ("commit", {}),
        ):
            response = _post(user, DEAD_SINK, DEAD_EPOCH, action, body)
            assert response.status_code == 503, (action, response.text)
            detail = response.json()
            assert detail["error"] == "SinkUnavailable"
            assert world.dead_conn_id in detail["detail"]
            assert f"postgresql+psycopg2://eo:***@127.0.0.1:{world.dead_port}/catalog" in detail["detail"]
        page = user.get(f"/sinks/{DEAD_SINK}/epochs/{DEAD_EPOCH}")
        assert page.status_code == 200  # reading needs only the meta store
    assert world.pipeline.store.get(DEAD_SINK, DEAD_EPOCH).status.value == "Pending"  # type: ignore[union-attr]


# -- 4 and 6. bad input: clean statuses, after the permission check ---------------------------------


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("/api/epochs", {"offset": str(EPOCH_MAX + 1)}),
        ("/api/epochs", {"offset": "-1"}),
        ("/api/epochs", {"sink": "no such sink!"}),
        (f"/api/sinks/{SINK}/epochs/{EPOCH_MAX + 1}", {}),
        ("/api/sinks/bad%20sink!/epochs/1", {}),
        ("/api/sinks/orders/epochs/not-a-number", {}),
    ],
)
def test_bad_reads_are_422_as_json(api_server: ApiServer, path: str, params: dict[str, str]) -> None:
    with api_server.client("viewer") as viewer:
        response = viewer.get(path, params=params)
    assert response.status_code == 422, response.text
    assert "detail" in json_of(response)


@pytest.mark.parametrize(
    "path",
    [
        f"/?offset={EPOCH_MAX + 1}",
        "/?offset=abc",
        f"/sinks/{SINK}/epochs/{EPOCH_MAX + 1}",
        "/sinks/bad%20sink!/epochs/1",
        f"/sinks/{SINK}/epochs/not-a-number",
    ],
)
def test_pages_answer_bad_input_with_the_error_page(api_server: ApiServer, path: str) -> None:
    with api_server.client("viewer") as viewer:
        response = viewer.get(path)
    assert response.status_code == 422, response.text
    assert response.headers["content-type"].startswith("text/html") and "<h1>Bad request</h1>" in response.text


def test_error_pages_for_missing_and_unavailable_things_are_pages(api_server: ApiServer) -> None:
    with api_server.client("admin") as admin:
        missing = admin.get(f"/sinks/{SINK}/epochs/12345")
        assert missing.status_code == 404 and missing.headers["content-type"].startswith("text/html")
        assert "<h1>Not found</h1>" in missing.text


def test_bad_actions_are_refused_after_the_permission_check(api_server: ApiServer) -> None:
    epoch = Epochs.CHECKPOINT_FAILED  # Pending, and no other test acts on it
    bad = (
        ("bad sink!", 1, {"reason": "r"}),
        (SINK, EPOCH_MAX + 1, {"reason": "r"}),
        (SINK, "x", {"reason": "r"}),
        (SINK, epoch, {"reason": "r", "force": "yes"}),
        (SINK, epoch, {"reason": "r", "dry_run": 1}),
        (SINK, epoch, {"reason": "line\x1b]0;owned\x07"}),
        (SINK, epoch, {"reason": "two\nlines"}),
    )
    with api_server.client("viewer") as viewer, api_server.client("user") as user:
        for sink_id, number, body in bad:
            # A viewer may edit no DAG: refused before anything about the request is judged.
            refused = _post(viewer, sink_id, number, "abort", body)
            assert refused.status_code == 403, (sink_id, number, body, refused.text)
            assert refused.json()["detail"] == "Forbidden: this user may not edit any DAG"
            malformed = _post(user, sink_id, number, "abort", body)
            assert malformed.status_code == 422, (sink_id, number, body, malformed.text)
        assert _post(user, SINK, epoch, "commit", {"dry_run": "true"}).status_code == 422
    assert api_server.world.status(epoch) == "Pending"


# -- 7. headers and the API docs ---------------------------------------------------------------------


def test_pages_carry_security_headers_and_no_inline_script(api_server: ApiServer) -> None:
    assert _inline_script('<p title="x onerror=1"><b onclick="x">a</b><script>1</script><script src="s"></script>') == [
        "<b onclick=...>",
        "<script> without src",
    ]
    with api_server.client("viewer") as viewer:
        for path in ("/", f"/sinks/{SINK}/epochs/{Epochs.COMMITTED}", "/api/sinks", f"/sinks/{SINK}/epochs/12345"):
            response = viewer.get(path)
            csp = response.headers["content-security-policy"]
            directives = dict(d.strip().split(" ", 1) for d in csp.split(";") if d.strip())
            assert directives["script-src"] == "'self'", csp
            assert directives["frame-ancestors"] == "'self'", csp
            assert response.headers["x-frame-options"] == "SAMEORIGIN"
            assert response.headers["x-content-type-options"] == "nosniff"
            if response.headers["content-type"].startswith("text/html"):
                assert _inline_script(response.text) == [], path


def test_the_api_docs_are_behind_the_apis_auth(api_server: ApiServer) -> None:
    with api_server.client() as anonymous:
        assert anonymous.get("/api/docs").status_code == 401
        assert anonymous.get("/api/openapi.json").status_code == 401
    with api_server.client("viewer") as viewer:
        docs = viewer.get("/api/docs")
        assert docs.status_code == 200 and "swagger-ui" in docs.text
        assert _inline_script(docs.text) == []
        spec = json_of(viewer.get("/api/openapi.json"))
        assert "/api/sinks/{sink_id}/epochs/{epoch}/abort" in spec["paths"]
        assert spec["servers"] == [{"url": "/exactly-once"}]


# -- 8. a stored write that does not parse --------------------------------------------------------------


def test_an_unreadable_stored_write_is_listed_as_such_and_every_other_epoch_too(api_server: ApiServer) -> None:
    """Issue 54: one row whose consumed range does not parse made the index, ``/api/epochs`` and the
    epoch's page answer 500 for everyone. Now it is listed and shown as unreadable, naming the field."""
    for username in ("admin", PARTNER):
        with api_server.client(username) as client:
            index = client.get("/")
            assert index.status_code == 200, (username, index.text[:2000])
            assert f'data-epoch="{BROKEN_EPOCH}"' in index.text and f'data-epoch="{Shared.OWNED}"' in index.text
            assert "unreadable:" in index.text and "source_positions" in index.text
            listed = json_of(client.get("/api/epochs"))
            assert listed[0]["epoch"] == BROKEN_EPOCH and "source_positions" in listed[0]["unreadable"]
            assert len(listed) > 1 and all(e["unreadable"] is None for e in listed[1:])
            assert client.get(f"/?sink={BROKEN_SINK}").status_code == 200
            detail = client.get(f"/api/sinks/{BROKEN_SINK}/epochs/{BROKEN_EPOCH}")
            assert detail.status_code == 200, (username, detail.text)
            shown = detail.json()["epoch"]
            assert (shown["dag_id"], shown["status"], shown["tables"]) == (PARTNER_DAG, "Pending", [])
            assert "source_positions" in shown["unreadable"]
            page = client.get(f"/sinks/{BROKEN_SINK}/epochs/{BROKEN_EPOCH}")
            assert page.status_code == 200 and 'id="epoch-unreadable"' in page.text, (username, page.text[:2000])
            assert "source_positions" in page.text
