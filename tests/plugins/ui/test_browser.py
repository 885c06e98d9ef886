"""The view in a real headless Chromium, through the real Airflow UI: log in, open it from the nav,
filter, open an epoch, abort it. Screenshots of each step are kept under
``$EO_TEST_ARTIFACTS/ui`` (default ``test-artifacts/ui``).

The browser is Debian's ``chromium`` package (``/usr/bin/chromium``), driven by Playwright's Python
package; Playwright's own browser downloads are not used.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.plugins.ui.conftest import (
    AUDITED_SINK,
    BASE,
    KEPT_OUT,
    OTHER_SINK,
    PICTURE_SIZES,
    PICTURE_STARTS,
    REDELIVERED,
    SINK,
    ApiServer,
    Audited,
    Epochs,
    PictureSink,
)
from tests.support.pipeline import write_location_exists

CHROMIUM = Path("/usr/bin/chromium")
#: Waits for the UI under a loaded machine (the first load of the Airflow UI compiles a lot of JS); not a
#: timing assertion, only the ceiling before a step is called failed.
TIMEOUT_MS = 90_000


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        reason = f"{CHROMIUM} is missing (Debian package 'chromium')"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI needs the browser: {reason}")
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


@contextmanager
def _screenshot_on_failure(page: Any, path: Path) -> Iterator[None]:
    """Keep what the browser showed when a step failed, next to the other screenshots."""
    try:
        yield
    except BaseException:
        page.screenshot(path=str(path), full_page=True)
        raise


def _log_in(browser: Any, api_server: ApiServer, username: str, artifacts: Path, width: int = 1500) -> Any:
    """A page logged in through Airflow's own login form (which sets the UI's JWT cookie)."""
    context = browser.new_context(viewport={"width": width, "height": 950})
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    with _screenshot_on_failure(page, artifacts / f"failed-login-{username}.png"):
        page.goto(f"{api_server.url}/")
        page.wait_for_url(re.compile(r".*/auth/login.*"))
        page.locator("input[name=username]").fill(username)
        page.locator("input[name=password]").fill(api_server.passwords[username])
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url(lambda url: "/auth/login" not in url)
    return page


def test_a_user_filters_opens_and_aborts_an_epoch(browser: Any, api_server: ApiServer, artifacts: Path) -> None:
    page = _log_in(browser, api_server, "user", artifacts)
    with _screenshot_on_failure(page, artifacts / "failed-user-abort.png"):
        _filter_open_and_abort(page, api_server, artifacts)
    page.context.close()


def _filter_open_and_abort(page: Any, api_server: ApiServer, artifacts: Path) -> None:
    world = api_server.world
    epoch = Epochs.WAITING_BROWSER

    # The view is in the UI's Browse menu; the UI shows it in a frame at /plugin/<url_route>.
    page.get_by_role("button", name="Browse").click()
    page.get_by_role("menuitem", name="Exactly-once sinks").click()
    page.wait_for_url(re.compile(r".*/plugin/exactly-once$"))
    view = page.frame_locator("iframe")
    view.locator("#epochs").wait_for()
    view.locator(f"#sinks tr[data-sink='{OTHER_SINK}']").wait_for()
    page.screenshot(path=str(artifacts / "01-sinks-in-airflow-nav.png"), full_page=True)

    view.locator("#filter-sink").select_option(SINK)
    view.locator("#filter-status").select_option("Pending")
    view.get_by_role("button", name="Filter").click()
    frame = page.main_frame.child_frames[0]
    frame.wait_for_url(re.compile(rf".*\?sink={SINK}&status=Pending$"))
    rows = view.locator("#epochs tr[data-epoch]")
    view.locator(f"#epochs tr[data-epoch='{epoch}']").wait_for()
    statuses = {rows.nth(i).get_attribute("data-status") for i in range(rows.count())}
    assert statuses == {"Pending"}
    assert view.locator(f"#epochs tr[data-epoch='{Epochs.COMMITTED}']").count() == 0
    page.screenshot(path=str(artifacts / "02-filtered-by-sink-and-status.png"), full_page=True)

    view.locator(f"#epochs tr[data-epoch='{epoch}'] a.epoch-link").click()
    view.locator("#epoch-status").wait_for()
    assert view.locator("#epoch-status").inner_text() == "Pending"
    assert view.locator("#checkpoint-status").inner_text() == "PENDING"
    assert view.locator("#delivery").get_attribute("data-how") == "one table"  # the sink has one table
    run_link = view.locator("#run-link")
    assert run_link.get_attribute("href") == f"/dags/eo_orders_hourly/runs/scheduled__{epoch}"
    assert run_link.get_attribute("target") == "_top"
    page.screenshot(path=str(artifacts / "03-epoch-pending.png"), full_page=True)

    view.locator("#abort-button").click()
    view.locator("#abort-reason").fill("upstream replays this hour; drop it")
    page.screenshot(path=str(artifacts / "04-abort-confirm.png"), full_page=True)
    view.locator("#abort-confirm").click()
    view.locator("#epoch-status", has_text="Aborted").wait_for()
    # the history, read in the page after the reload: persisted by the write's run, aborted by this user
    aborted = view.locator("#history li[data-event='aborted']")
    aborted.wait_for()
    assert "by ui user" in aborted.inner_text() and "upstream replays this hour" in aborted.inner_text()
    events = view.locator("#history li")
    assert [events.nth(i).get_attribute("data-event") for i in range(events.count())][:2] == ["persisted", "aborted"]
    page.screenshot(path=str(artifacts / "05-epoch-aborted.png"), full_page=True)

    assert world.status(epoch) == "Aborted"
    assert not write_location_exists(world.writes[epoch])


def test_a_viewer_sees_no_action_and_a_refusal_is_shown(browser: Any, api_server: ApiServer, artifacts: Path) -> None:
    viewer = _log_in(browser, api_server, "viewer", artifacts)
    viewer.goto(f"{api_server.url}/exactly-once/sinks/{SINK}/epochs/{Epochs.ABORT_REFUSED}")
    viewer.locator("#epoch-status").wait_for()
    assert viewer.locator("#actions button").count() == 0
    assert "needs permission to edit" in viewer.locator("#actions").inner_text()
    viewer.context.close()

    # A user may try; the coordinator refuses to abort an epoch whose checkpoint completed.
    user = _log_in(browser, api_server, "user", artifacts)
    user.goto(f"{api_server.url}/exactly-once/sinks/{SINK}/epochs/{Epochs.ABORT_REFUSED}")
    user.locator("#abort-button").click()
    user.locator("#abort-confirm").click()
    result = user.locator("#action-result")
    result.wait_for()
    assert result.inner_text().startswith("409") and "checkpoint COMPLETED" in result.inner_text()
    user.screenshot(path=str(artifacts / "06-abort-refused.png"), full_page=True)
    assert api_server.world.status(Epochs.ABORT_REFUSED) == "Pending"
    user.context.close()


def test_a_user_rejects_an_epoch_whose_audit_failed(browser: Any, api_server: ApiServer, artifacts: Path) -> None:
    """The Reject button and its reason dialog (``ui.js``), as the abort's: the epoch is Aborted,
    its files gone, and the history says who rejected it and why."""
    world, epoch = api_server.world, Audited.FAILED_BROWSER
    page = _log_in(browser, api_server, "user", artifacts)
    with _screenshot_on_failure(page, artifacts / "failed-user-reject.png"):
        page.goto(f"{api_server.url}/exactly-once/sinks/{AUDITED_SINK}/epochs/{epoch}")
        page.locator("#audit-stage").wait_for()
        assert page.locator("#epoch-stage").inner_text() == "Audit failed"
        assert "no_null_ids" in page.locator("#audit-failed").inner_text()
        page.screenshot(path=str(artifacts / "07-epoch-audit-failed.png"), full_page=True)
        page.locator("#reject-button").click()
        page.locator("#reject-reason").fill("null ids in the audit; the source is being fixed")
        page.locator("#reject-confirm").click()
        page.locator("#epoch-status", has_text="Aborted").wait_for()
        aborted = page.locator("#history li[data-event='aborted']")
        aborted.wait_for()
        assert "by ui user" in aborted.inner_text() and "null ids in the audit" in aborted.inner_text()
        assert page.locator("#reject-button").count() == 0
        page.screenshot(path=str(artifacts / "08-epoch-rejected.png"), full_page=True)
    page.context.close()
    assert world.status(epoch, AUDITED_SINK) == "Aborted"
    assert not write_location_exists(world.audited_writes[epoch])


def test_the_history_of_a_reprocessed_and_a_redelivered_day(
    browser: Any, api_server: ApiServer, artifacts: Path
) -> None:
    """What the epoch page's timeline tells of two days whose rows alone look like any committed day."""
    viewer = _log_in(browser, api_server, "viewer", artifacts)

    def events(epoch: int) -> list[str]:
        viewer.goto(f"{api_server.url}/exactly-once/sinks/{OTHER_SINK}/epochs/{epoch}")
        items = viewer.locator("#history li")
        items.first.wait_for()
        return [str(items.nth(i).get_attribute("data-event")) for i in range(items.count())]

    with _screenshot_on_failure(viewer, artifacts / "failed-history.png"):
        reprocessed = events(BASE)
        assert [e for e in reprocessed if e != "commit decided"] == [
            "persisted",
            "committed",
            "revision opened",
            "committed",
        ]
        assert "revision 1" in viewer.locator("#history li").last.inner_text()
        viewer.screenshot(path=str(artifacts / "07-history-reprocessed.png"), full_page=True)

        redelivered = [e for e in events(REDELIVERED) if e not in ("commit decided", "cleaned up")]
        assert redelivered == ["persisted", "aborted", "replaced", "committed"]
        aborted = viewer.locator("#history li[data-event='aborted']").inner_text()
        assert "the upstream gave the hour up" in aborted
        viewer.screenshot(path=str(artifacts / "08-history-redelivered.png"), full_page=True)
    viewer.context.close()


def test_the_picture_of_one_sinks_epochs(browser: Any, api_server: ApiServer, artifacts: Path) -> None:
    """The sinks page filtered to one sink draws its epochs: one mark per row of the table under it,
    the reprocessed day numbered, the day whose reprocess the sink kept out marked with its warning,
    and a mark opens its epoch's page."""
    viewer = _log_in(browser, api_server, "viewer", artifacts)
    with _screenshot_on_failure(viewer, artifacts / "failed-picture.png"):
        viewer.goto(f"{api_server.url}/exactly-once/?sink={OTHER_SINK}")
        chart = viewer.locator("#epoch-chart svg")
        chart.wait_for()
        rows = viewer.locator("#epochs tr[data-epoch]")
        marks = chart.locator(".mark")
        drawn = {int(str(marks.nth(i).get_attribute("data-epoch"))) for i in range(marks.count())}
        listed = {int(str(rows.nth(i).get_attribute("data-epoch"))) for i in range(rows.count())}
        assert drawn == listed == {BASE, KEPT_OUT, REDELIVERED}
        revised = chart.locator("rect.revised")
        assert revised.count() == 1 and chart.locator("text.lane-text", has_text="1").count() == 1
        warned = chart.locator("a.col:has(rect.warned)")
        assert warned.count() == 1 and warned.locator(".mark").get_attribute("data-epoch") == str(KEPT_OUT)
        assert "keeps what it committed" in str(warned.locator("title").text_content())
        box = chart.bounding_box()
        assert box is not None and box["width"] > 300 and box["height"] > 60  # drawn, not collapsed
        viewer.screenshot(path=str(artifacts / "09-sink-picture.png"), full_page=True)
        chart.locator(f".mark[data-epoch='{REDELIVERED}']").click()
        viewer.wait_for_url(re.compile(rf".*/sinks/{OTHER_SINK}/epochs/{REDELIVERED}$"))
        viewer.locator("#history li").first.wait_for()
    viewer.context.close()


# -- issue 55: the picture read at a glance, at 1280 px in Airflow's frame ------------------------------

#: Run in the view's frame: the picture scrolled into the frame's view, then for each mark of an
#: aborted or warned epoch its box, whether it lies in the frame's viewport, whether the element at
#: its centre is the mark itself (nothing drawn over it), and the tooltip of its column; and what of
#: the picture and the page runs past the frame's width.
_LOOK_AT_THE_PICTURE = """
() => {
  const svg = document.querySelector("#epoch-chart svg");
  svg.scrollIntoView({block: "center"});
  const vw = document.documentElement.clientWidth, vh = window.innerHeight;
  const seen = (mark) => {
    const r = mark.getBoundingClientRect();
    const x = r.left + r.width / 2, y = r.top + r.height / 2;
    const title = (mark.querySelector("title") || mark.closest("a")?.querySelector("title"));
    return {
      epoch: Number(mark.getAttribute("data-epoch") || mark.closest("a").querySelector(".mark").getAttribute("data-epoch")),
      width: r.width, height: r.height,
      inside: r.left >= 0 && r.right <= vw && r.top >= 0 && r.bottom <= vh,
      top: document.elementFromPoint(x, y) === mark,
      over: document.elementFromPoint(x, y)?.outerHTML.slice(0, 120) || null,
      title: title ? title.textContent : "",
    };
  };
  const box = svg.getBoundingClientRect();
  return {
    marks: Array.from(svg.querySelectorAll(".mark")).map((m) => Number(m.getAttribute("data-epoch"))),
    aborted: Array.from(svg.querySelectorAll(".mark[data-status='Aborted']")).map(seen),
    warned: Array.from(svg.querySelectorAll(".warned")).map(seen),
    picture: {left: box.left, right: box.right, width: box.width, height: box.height},
    frame: {width: vw, scrollWidth: document.documentElement.scrollWidth},
  };
}
"""

#: The table's rows of one epoch (its own and the one under it): the element that shows its cause
#: whole, and whether it is cut (wider than its box, or past the frame's edge).
_LOOK_AT_THE_CAUSE = """
([epoch, cause]) => {
  const row = document.querySelector(`#epochs tr[data-epoch="${epoch}"]`);
  row.scrollIntoView({block: "center"});
  const rows = [row, row.nextElementSibling].filter((r) => r && !r.hasAttribute("data-epoch"));
  rows.unshift(row);
  const holding = rows.flatMap((r) => Array.from(r.querySelectorAll("*")))
    .filter((e) => e.textContent.includes(cause));
  const shown = holding[holding.length - 1];
  const table = document.querySelector("#epochs").parentElement;
  const vw = document.documentElement.clientWidth;
  if (!shown) { return {shown: false, table: [table.scrollWidth, table.clientWidth]}; }
  const r = shown.getBoundingClientRect();
  return {
    shown: true, visible: r.width > 0 && r.height > 0 && r.left >= 0 && r.right <= vw,
    cut: shown.scrollWidth > shown.clientWidth, table: [table.scrollWidth, table.clientWidth],
  };
}
"""


@pytest.fixture(scope="module")
def framed(browser: Any, api_server: ApiServer, artifacts: Path) -> Iterator[tuple[Any, Any]]:
    """A viewer in the Airflow UI at 1280 px, the view opened from the UI's nav: the page and the frame."""
    page = _log_in(browser, api_server, "viewer", artifacts, width=1280)
    with _screenshot_on_failure(page, artifacts / "failed-picture-nav.png"):
        page.get_by_role("button", name="Browse").click()
        page.get_by_role("menuitem", name="Exactly-once sinks").click()
        page.wait_for_url(re.compile(r".*/plugin/exactly-once$"))
        page.frame_locator("iframe").locator("#epochs").wait_for()
    yield page, page.main_frame.child_frames[0]
    page.context.close()


@pytest.mark.parametrize("size", PICTURE_SIZES)
@pytest.mark.parametrize("span", list(PICTURE_STARTS))
def test_every_aborted_and_refused_epoch_is_seen_in_the_picture_in_airflows_frame(
    framed: tuple[Any, Any],
    picture_sinks: dict[tuple[str, int], PictureSink],
    api_server: ApiServer,
    artifacts: Path,
    span: str,
    size: int,
) -> None:
    """1, 50 and 500 epochs over a day and over two years, in Airflow's frame at 1280 px: every
    aborted epoch's mark and every warned one's is in view, has a size, and is the element at its
    own centre; its tooltip gives the cause; the picture and the page fit the frame; and the cause
    of each aborted epoch of the table is shown whole under it, not cut, as text."""
    page, frame = framed
    case = picture_sinks[(span, size)]
    with _screenshot_on_failure(page, artifacts / f"failed-picture-{span}-{size}.png"):
        frame.goto(f"{api_server.url}/exactly-once/?sink={case.sink_id}")
        frame.locator("#epoch-chart svg").wait_for()
        seen = frame.evaluate(_LOOK_AT_THE_PICTURE)
        page.screenshot(path=str(artifacts / f"10-picture-{span}-{size}-in-airflow.png"))
        frame.locator("#epoch-chart").screenshot(path=str(artifacts / f"10-picture-{span}-{size}.png"))

        assert seen["marks"] == sorted(case.epochs)[-500:]
        assert {m["epoch"] for m in seen["aborted"]} == set(case.aborted) and len(seen["aborted"]) == len(case.aborted)
        assert {m["epoch"] for m in seen["warned"]} == set(case.warned)
        for mark in seen["aborted"] + seen["warned"]:
            assert mark["width"] >= 1 and mark["height"] >= 4 and mark["inside"], mark
            assert mark["top"], f"epoch {mark['epoch']}'s mark is under {mark['over']}"
        for mark in seen["aborted"]:
            assert case.aborted[mark["epoch"]] in mark["title"], mark
        picture, window = seen["picture"], seen["frame"]
        assert picture["left"] >= 0 and picture["right"] <= window["width"] and picture["height"] > 60, seen
        assert window["scrollWidth"] <= window["width"], window  # nothing runs past the frame's edge
        assert frame.locator("img.planted").count() == 0

        newest = set(sorted(case.epochs, reverse=True)[:100])  # the table's first page
        for epoch, cause in case.aborted.items():
            if epoch in newest:
                shown = frame.evaluate(_LOOK_AT_THE_CAUSE, [epoch, cause])
                assert shown["shown"] and shown["visible"] and not shown["cut"], (epoch, shown)
                assert shown["table"][0] <= shown["table"][1], shown  # the table is not scrolled sideways
        if size == 50:  # one of the causes, as a new user finds it, in the table under the picture
            epoch = min(case.aborted)
            frame.locator(f"#epochs tr[data-detail-of='{epoch}']").scroll_into_view_if_needed()
            page.screenshot(path=str(artifacts / f"11-cause-{span}-{size}-in-airflow.png"))
