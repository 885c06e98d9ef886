"""The sink-state view tells what went wrong (issue 55), through a real ``airflow api-server`` over the
world of ``conftest.py`` (``SILVER_SINK``, ``LIVE_SINK``, and the runs made in Airflow's database):

- an aborted epoch's page says its cause (the failed write, its try, Spark's error) with a link to
  the task's log in Airflow, its checkpoint as "range reserved", and the later epoch that read its
  range; the API gives the same, each failed task's event with its sentence and log;
- an epoch reserved by a killed run (no row) is listed, filtered by ``Reserved``, and shown with its
  range and run, and can be aborted;
- the sink page warns of the run that will never finish and says how to fail it, and not of runs
  quiet for hours but alive (a deferred sensor, a heartbeat).
"""

from __future__ import annotations

from urllib.parse import quote

from tests.plugins.ui.conftest import (
    CAST_OVERFLOW,
    LIVE_SINK,
    PARTNER,
    SHARED_SINK,
    SILVER_DAG,
    SILVER_SINK,
    SILVER_WRITE,
    ApiServer,
    Live,
    Shared,
    Silver,
    json_of,
)

FAILED = f"write failed on try 2: {CAST_OVERFLOW}"
WRITE_LOG = f"/dags/{SILVER_DAG}/runs/{quote(Silver.RUNS[Silver.ABORTED])}/tasks/{SILVER_WRITE}?try_number="


def test_the_aborted_epochs_answer_holds_its_cause_and_the_failed_tasks_log(api_server: ApiServer) -> None:
    with api_server.client("admin") as admin:
        detail = json_of(admin.get(f"/api/sinks/{SILVER_SINK}/epochs/{Silver.ABORTED}"))
    row = detail["epoch"]
    assert (row["status"], row["error"]) == ("Aborted", FAILED)
    assert row["cause"] == {
        "at": row["cause"]["at"],
        "step": FAILED,
        "dag_id": SILVER_DAG,
        "run_id": Silver.RUNS[Silver.ABORTED],
        "task_id": SILVER_WRITE,
        "try_number": 2,
        "log_url": WRITE_LOG + "2",
    }
    assert row["consumed"] == "bronze.orders: after snapshot 100 to snapshot 200"
    assert row["reservation"]["read_again_by"] == [{"epoch": Silver.AGAIN, "status": "Committed"}]
    assert (detail["checkpoint"]["status"], detail["checkpoint"]["meaning"]) == ("COMPLETED", "range reserved")
    failures = [(e["event"], e["step"], e["log_url"]) for e in detail["history"] if e["step"]]
    assert failures == [
        ("try failed", f"write failed on try 1, retried: {CAST_OVERFLOW}", WRITE_LOG + "1"),
        ("error", FAILED, WRITE_LOG + "2"),
    ]
    assert "an upstream step failed" not in str(detail)
    assert detail["history"][-1]["event"] == "range read again"


def test_the_aborted_epochs_page_says_why_prominently_with_the_log_and_the_epoch_that_read_its_range(
    api_server: ApiServer,
) -> None:
    with api_server.client("admin") as admin:
        page = admin.get(f"/sinks/{SILVER_SINK}/epochs/{Silver.ABORTED}")
    assert page.status_code == 200, page.text[:2000]
    html = page.text
    error = html.split('id="epoch-error"', 1)[1].split("</div>\n", 1)[0]
    assert "Aborted because" in error and "write failed on try 2: SparkArithmeticException: [CAST_OVERFLOW]" in error
    assert f'href="{WRITE_LOG}2"' in error.replace("&amp;", "&") and 'id="cause-log"' in error
    checkpoint = html.split('id="checkpoint-status"', 1)[1].split("</span>", 1)[0]
    assert checkpoint.endswith(">range reserved") and "COMPLETED" not in checkpoint.split(">", 1)[1]
    again = html.split('id="range-read-again"', 1)[1].split("</div>", 1)[0]
    assert f"/exactly-once/sinks/{SILVER_SINK}/epochs/{Silver.AGAIN}" in again and "(Committed)" in again
    assert html.count('class="log-link"') == 2  # each failed try's event links its log
    assert 'id="consumed"' in html and "after snapshot 100 to snapshot 200" in html


def test_an_epoch_reserved_by_a_killed_run_is_listed_filtered_and_shown(api_server: ApiServer) -> None:
    with api_server.client("admin") as admin:
        listed = json_of(admin.get("/api/epochs", params={"sink": SILVER_SINK}))
        assert [(e["epoch"], e["status"]) for e in listed] == [
            (Silver.RESERVED, "Reserved"),
            (Silver.AGAIN, "Committed"),
            (Silver.ABORTED, "Aborted"),
            (Silver.COMMITTED, "Committed"),
        ]
        assert [e["epoch"] for e in json_of(admin.get("/api/epochs", params={"status": "Reserved"}))] == [
            Silver.RESERVED
        ]
        detail = json_of(admin.get(f"/api/sinks/{SILVER_SINK}/epochs/{Silver.RESERVED}"))
        page = admin.get(f"/sinks/{SILVER_SINK}/epochs/{Silver.RESERVED}").text
        index = admin.get("/", params={"sink": SILVER_SINK, "status": "Reserved"}).text
        pictured = admin.get("/", params={"sink": SILVER_SINK})
        dry = admin.post(
            f"/api/sinks/{SILVER_SINK}/epochs/{Silver.RESERVED}/abort",
            json={"reason": "its run was killed", "dry_run": True},
        )
    row = detail["epoch"]
    assert (row["status"], row["dag_id"], row["run_id"], row["written"]) == (
        "Reserved",
        SILVER_DAG,
        Silver.KILLED_RUN,
        False,
    )
    assert row["reservation"]["range"] == "bronze.orders: after snapshot 300 to snapshot 400"  # after AGAIN's end
    assert row["reservation"]["position"] == 3 and detail["can_edit"]
    assert 'id="epoch-status">Reserved<' in page and 'id="epoch-reservation"' in page
    assert "not written by a DAG run" not in page and Silver.KILLED_RUN in page
    assert 'id="abort-button"' in page
    assert f'data-epoch="{Silver.RESERVED}" data-status="Reserved"' in index
    assert '<option value="Reserved" selected>' in index
    assert pictured.status_code == 200 and 'id="epoch-chart"' in pictured.text  # drawn with the reserved epoch
    assert dry.status_code == 200 and json_of(dry)["outcome"] == "would abort"


def test_the_sink_page_warns_of_the_run_that_will_never_finish_and_says_how_to_fail_it(
    api_server: ApiServer,
) -> None:
    with api_server.client("admin") as admin:
        index = admin.get("/")
        one = admin.get("/", params={"sink": LIVE_SINK})
    assert index.status_code == 200, index.text[:2000]
    block = index.text.split('id="stale-runs"', 1)[1].split("</section>", 1)[0]
    [warning] = block.split('class="alert alert-warning stale-run"')[1:]
    assert f'data-sink="{SILVER_SINK}" data-epoch="{Silver.RESERVED}" data-run="{Silver.KILLED_RUN}"' in warning
    assert "Mark as failed" in warning and f"/dags/{SILVER_DAG}/runs/{Silver.KILLED_RUN}" in warning
    assert f"PATCH /api/v2/dags/{SILVER_DAG}/dagRuns/{Silver.KILLED_RUN}" in warning
    assert "{&#34;state&#34;: &#34;failed&#34;}" in warning or '{"state": "failed"}' in warning
    assert f"eo-sink abort {SILVER_SINK} {Silver.RESERVED}" in warning
    for run_id in Live.RUNS.values():  # quiet for hours, but a sensor waits and a task heartbeats
        assert run_id not in block and run_id in index.text
    assert 'id="runs-not-checked"' not in index.text
    assert 'id="stale-runs"' not in one.text


def test_another_dags_failed_task_and_its_log_stay_hidden_from_a_user_of_one_dag(api_server: ApiServer) -> None:
    """The other DAG's failed task on the partner's epoch: an admin reads it with its log; the
    partner reads that another DAG's task failed, and neither its text nor its log."""
    path = f"/api/sinks/{SHARED_SINK}/epochs/{Shared.OWNED}"
    with api_server.client("admin") as admin:
        [theirs] = [e for e in json_of(admin.get(path))["history"] if e["step"]]
    assert theirs["log_url"] and theirs["log_url"].startswith("/dags/eo_events_elsewhere/runs/")
    with api_server.client(PARTNER) as partner:
        [hidden] = [e for e in json_of(partner.get(path))["history"] if e["step"]]
        index = partner.get("/")
    assert (hidden["step"], hidden["task_id"], hidden["log_url"], hidden["run_id"]) == (
        "(not shown: written by a run of another DAG)",
        None,
        None,
        None,
    )
    assert 'id="stale-runs"' not in index.text  # the silver DAG's run is not the partner's
