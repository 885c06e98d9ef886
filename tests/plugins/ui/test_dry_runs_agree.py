"""The view's dry run answers what its action answers (issue 31), on the real API server: an upsert
epoch behind an undecided one is refused by the dry run with the commit's own status and words, not
"would commit". The service-level suite (tests/operations/test_dry_runs_agree.py) runs every refusal.
"""

from __future__ import annotations

import uuid

from airflow_provider_exactly_once.checkpoints.config import MetaStoreCheckpoint
from airflow_provider_exactly_once.core.epochs import CheckpointStatus
from airflow_provider_exactly_once.core.upserts import UpsertSpec
from airflow_provider_exactly_once.sinks.config import IcebergSinkConfig
from tests.plugins.ui.conftest import DAG_ID, ApiServer
from tests.support.upsert_writer import KEYED, write_upsert


def test_a_commit_the_order_of_upsert_epochs_refuses_is_refused_by_its_dry_run(api_server: ApiServer) -> None:
    world = api_server.world
    pipeline, suffix = world.pipeline, uuid.uuid4().hex[:8]
    sink_id, table = f"upserts-{suffix}", f"{pipeline.namespace}.keyed_{suffix}"
    pipeline.catalog.create_table(table, schema=KEYED)
    config = IcebergSinkConfig(sink_id, (table,), iceberg_conn_id=world.catalog_conn_id, upsert=UpsertSpec(key=("id",)))
    pipeline.store.registry.register_sink(
        sink_id, config.model_dump(mode="json"), MetaStoreCheckpoint().model_dump(mode="json")
    )
    coordinator = pipeline.coordinator(sink_id, pipeline.iceberg_committer())
    for epoch, key in ((1, 1), (2, 2)):
        pre = write_upsert(pipeline.catalog, table, sink_id, epoch, {key: "v"}, str(uuid.uuid4()))
        coordinator.persist(pre, run_id=f"scheduled__{epoch}", try_number=1, dag_id=DAG_ID)
    pipeline.checkpoint(sink_id, 2, CheckpointStatus.COMPLETED)  # epoch 1's is still PENDING

    with api_server.client("user") as user:
        path = f"/api/sinks/{sink_id}/epochs/2/commit"
        dry = user.post(path, json={"dry_run": True})
        real = user.post(path, json={})
    assert dry.status_code == real.status_code != 200, (dry.text, real.text)
    assert dry.json()["detail"] == real.json()["detail"]
    assert "undecided (Pending): 1" in dry.json()["detail"]
    assert world.status(2, sink_id) == "Pending"
