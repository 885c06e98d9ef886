"""Where the demo's tables, landed input and checkpoint markers live (``--stack``).

``local``: the embedded defaults, nothing to start: an Iceberg SQL catalog on SQLite, the warehouse,
the landing zone and the ``_SUCCESS``/``_FAILED`` markers on local disk.

``s3``: one SeaweedFS (``weed mini``, ``servers.SeaweedFS``) under the demo's root, started on free
ports of 127.0.0.1 and stopped when the demo ends however it ends. The Iceberg connection is its
REST catalog, configured as a user configures the Iceberg provider's ``iceberg`` connection (URI in
``host``, the OAuth2 client credentials in ``login``/``password``, the ``s3.*`` FileIO properties in
the extra); the tables' data and metadata are on its S3, and so are the landed event files and the
markers, read through an ``aws`` connection (``storage_conn_id``). Airflow's database and the meta
store stay SQLite files: what changes on object storage is how files and commits are reached, which
is what this stack exercises.

``--spark connect`` (either stack): the writes go through a Spark Connect server (``local[2]``,
``servers.SparkConnectServer``) the demo starts beside the rest, its ``spark_default`` connection of
type ``spark_connect``; the DAG is the same.

Nothing here imports Airflow: ``environment`` runs before Airflow reads its configuration.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from demo import servers, world

STACKS = ("local", "s3")
#: The ``aws`` connection the markers are read through on the ``s3`` stack.
STORAGE_CONN_ID = "eo_demo_s3"
#: Where the upstream lands its hours on the ``s3`` stack, in SeaweedFS's plain bucket.
LANDING_PREFIX = "landing/events"


@dataclass
class Stack:
    """The ``local`` stack, the embedded defaults: no server, every file under the demo's root.
    ``S3Stack`` puts the same things on object storage."""

    root: Path
    #: ``submit``: each write is a ``spark-submit``; ``connect``: a client of ``connect_server``.
    spark: str = "submit"
    name: str = field(default="local", init=False)
    connect_server: servers.SparkConnectServer | None = field(default=None, init=False)

    @property
    def description(self) -> str:
        return f"Airflow, meta store and Iceberg catalog on SQLite; {self.spark_description}"

    @property
    def spark_description(self) -> str:
        if self.connect_server is None:
            return "Spark local[2] (spark-submit)"
        return f"Spark Connect server local[2] at {self.connect_server.url}"

    @property
    def landing(self) -> str:
        """The landing root the DAG reads (its ``EO_EXAMPLES_LANDING``)."""
        return str(self.root / "landing" / "events")

    def start(self) -> None:
        """Nothing runs beside the demo's own process, but the Spark Connect server when asked for."""
        if self.spark == "connect":
            self.connect_server = servers.SparkConnectServer(self.root / "spark-connect")
            self.connect_server.start({"spark.sql.shuffle.partitions": "2", "spark.driver.memory": "1g"})

    def stop(self) -> None:
        if self.connect_server is not None:
            self.connect_server.stop()

    def environment(self) -> dict[str, str]:
        """Over ``world.environment``'s defaults: the landing zone, named here so the DAG reads
        where ``land`` writes; the local catalog and connections are the defaults, but the Spark
        connection with ``--spark connect``."""
        env = {"EO_EXAMPLES_LANDING": self.landing}
        if self.connect_server is not None:
            connection = {"conn_type": "spark_connect", "host": "127.0.0.1", "port": self.connect_server.port}
            env["AIRFLOW_CONN_SPARK_DEFAULT"] = json.dumps(connection)
        return env

    def locations(self) -> str:
        return f"tables in {self.root / 'warehouse'}; landed input and checkpoint markers in {self.landing}"

    def land(self, hour: dt.datetime, rows: int) -> int:
        """Land the hour's events; how many were landed."""
        return len(world.land_hour(Path(self.landing), hour, rows))

    def mark(self, hour: dt.datetime, *, completed: bool) -> None:
        world.mark_hour(Path(self.landing), hour, completed=completed)


@dataclass
class S3Stack(Stack):
    """SeaweedFS's REST catalog and S3 under the tables, the landed input and the markers."""

    name: str = field(default="s3", init=False)
    seaweed: servers.SeaweedFS = field(init=False)

    def __post_init__(self) -> None:
        # Lance's namespace server takes a fixed port (9101) unless told otherwise, and another
        # weed on this machine (a test session, the fault harness) may hold it; the demo needs no Lance.
        self.seaweed = servers.SeaweedFS(self.root / "seaweedfs", ports={"s3.port.lance": 0})

    @property
    def description(self) -> str:
        return (
            f"Iceberg REST catalog and S3 on SeaweedFS ({self.seaweed.catalog_uri}, {self.seaweed.s3_endpoint}); "
            f"Airflow and meta store on SQLite; {self.spark_description}"
        )

    @property
    def landing(self) -> str:
        return f"s3://{self.seaweed.bucket}/{LANDING_PREFIX}"

    def start(self) -> None:
        """Start ``weed mini``; ``servers.ServerUnavailable`` says what is missing when it cannot."""
        self.seaweed.start()
        super().start()

    def stop(self) -> None:
        super().stop()
        self.seaweed.stop()

    def environment(self) -> dict[str, str]:
        """The two connections a user would define for this platform, and the landing zone on S3."""
        iceberg = {
            "conn_type": "iceberg",
            "host": self.seaweed.catalog_uri,
            "login": servers.ACCESS_KEY,
            "password": servers.SECRET_KEY,
            "extra": {
                "type": "rest",
                "oauth2-server-uri": f"{self.seaweed.catalog_uri}/v1/oauth/tokens",
                "warehouse": self.seaweed.warehouse,
                **self.seaweed.s3_properties(),
            },
        }
        storage = {
            "conn_type": "aws",
            "login": servers.ACCESS_KEY,
            "password": servers.SECRET_KEY,
            "extra": {"endpoint_url": self.seaweed.s3_endpoint, "region_name": servers.REGION},
        }
        return {
            **super().environment(),
            f"AIRFLOW_CONN_{world.ICEBERG_CONN_ID.upper()}": json.dumps(iceberg),
            f"AIRFLOW_CONN_{STORAGE_CONN_ID.upper()}": json.dumps(storage),
            # The example DAG reads its checkpoint markers through this connection.
            "EO_EXAMPLES_STORAGE_CONN_ID": STORAGE_CONN_ID,
        }

    def locations(self) -> str:
        return (
            f"tables in {self.seaweed.warehouse} (catalog {self.seaweed.catalog_uri}); landed input and checkpoint "
            f"markers in {self.landing} (connection {STORAGE_CONN_ID!r})"
        )

    def land(self, hour: dt.datetime, rows: int) -> int:
        ids, contents = world.hour_files(hour, rows)
        for name, text in contents.items():
            self._fs.pipe_file(f"{self._hour_key(hour)}/{name}", text.encode("utf-8"))
        return len(ids)

    def mark(self, hour: dt.datetime, *, completed: bool) -> None:
        self._fs.pipe_file(f"{self._hour_key(hour)}/{'_SUCCESS' if completed else '_FAILED'}", b"")

    def _hour_key(self, hour: dt.datetime) -> str:
        """The hour's folder as the DAG names it (``<landing>/{start:%Y/%m/%d/%H}``), without ``s3://``."""
        return f"{self.seaweed.bucket}/{LANDING_PREFIX}/{hour:%Y/%m/%d/%H}"

    @functools.cached_property
    def _fs(self) -> Any:
        import s3fs

        return s3fs.S3FileSystem(**self.seaweed.s3fs_options(), skip_instance_cache=True)


def make_stack(name: str, root: Path, *, spark: str = "submit") -> Stack:
    if name == "local":
        return Stack(root, spark)
    if name == "s3":
        return S3Stack(root, spark)
    raise ValueError(f"unknown stack {name!r}; known: {STACKS}")
