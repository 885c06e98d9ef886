"""The platforms a harness cluster can stand on (``Cluster.create(stack=...)``, ``scripts/faults --stack``).

``local``: LocalExecutor, the Iceberg tables in a pyiceberg SQL catalog (a database on the shared
PostgreSQL) with their files on local disk. Cheap, and what every earlier result was measured on.

``production``: what a real deployment looks like where it matters to exactly-once delivery.
Airflow runs on the CeleryExecutor with two Celery workers (``celery-worker-1``, ``celery-worker-2``),
so a task's process belongs to a worker that can be lost on its own; the broker is the Redis at
127.0.0.1:6379 under a key prefix of the cluster's own (two clusters never share a queue), the
result backend the cluster's Airflow database. Spark is a standalone master with one worker
(component ``spark-standalone``): the Spark writer's executors run in JVMs of their own, which a
kill -9 of the task leaves to the master to reap. The tables live behind SeaweedFS's Iceberg REST
catalog with their data and metadata on SeaweedFS's S3 (component ``seaweedfs``), so a commit is a
network call that can fail half-way and the catalog itself can crash. A second Iceberg connection
(``PROXIED_ICEBERG_CONN_ID``) reaches the same catalog through an HTTP proxy in the harness's process
(``fault_harness.proxy``), as a load balancer would: a scenario whose pipeline uses it can have the
proxy lose a commit's response after the catalog applied it. Both connections ask for the REST
catalog's multi-table commit (``exactly-once.multi-table-commit``, design.md D18), which SeaweedFS
serves without listing it: a fan-out pipeline's tables are committed in one request there. SeaweedFS
moves the tables' pointers one after the other inside that request, so readers between the moves are
not what the harness judges; what the tables hold in the end is.

Either stack has a Spark Connect server on call (component ``spark-connect``, ``local[2]``): its
port is chosen when the cluster is made, so the connection ``SPARK_CONNECT_CONN_ID`` is in every
component's environment, and it starts when a pipeline that writes through it first needs it
(``Cluster.start("spark-connect")``); a cluster without such a pipeline never pays for its JVM.

Like ``cluster``, nothing here imports Airflow.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]

from airflow_provider_exactly_once.sinks.iceberg.table_transactions import SETTING as MULTI_TABLE_COMMIT
from demo.servers import SeaweedFS, SparkConnectServer, SparkStandalone, free_port
from fault_harness.proxy import Proxy

STACKS = ("local", "production")
#: The broker's Redis server and database; every cluster adds a key prefix of its own.
REDIS_URL = os.environ.get("EO_FAULTS_REDIS_URL", "redis://127.0.0.1:6379/0")
#: Under Celery, a task stays ``queued`` while its message sits with a worker that was killed before
#: starting it (the message is unacknowledged until Redis's visibility timeout, a day). The scheduler
#: re-queues such a task after this long; Airflow's 600 s default would outlast a CI run.
TASK_QUEUED_TIMEOUT_S = 180
#: The production stack's Iceberg connection through ``Stack.catalog_proxy``; the main connection
#: goes to the catalog directly, so that no other scenario's commits pass a proxy that could change
#: what they see (a refused connection, known unsent, would become a lost response, outcome unknown).
PROXIED_ICEBERG_CONN_ID = "iceberg_faults_proxied"
#: The Spark Connect server's settings: one shuffle partition (an epoch of the harness is a few dozen
#: rows), and a driver smaller than Spark's default, beside a cluster of Airflow processes.
SPARK_CONNECT_CONF = {"spark.sql.shuffle.partitions": "1", "spark.driver.memory": "1g"}


class StackUnavailable(RuntimeError):
    """The production stack cannot start here (no ``weed`` binary, no Redis): the message says what."""


@dataclass
class Stack:
    """The ``local`` stack; ``ProductionStack`` adds Celery workers and SeaweedFS."""

    root: Path
    suffix: str
    parallelism: int
    name: str = "local"
    #: Airflow components beyond the four every stack has (Celery workers), started like them.
    workers: tuple[str, ...] = ()
    #: Components that are servers of their own (``kill``, ``start`` again on the same ports).
    servers: dict[str, Any] = field(default_factory=dict)
    #: The HTTP proxy in front of the REST catalog (``PROXIED_ICEBERG_CONN_ID``), if the stack has one.
    catalog_proxy: Proxy | None = None
    spark_connect: SparkConnectServer = field(init=False)

    def __post_init__(self) -> None:
        self.spark_connect = SparkConnectServer(
            self.root / "spark-connect", port=free_port(), conf=dict(SPARK_CONNECT_CONF)
        )
        self.servers["spark-connect"] = self.spark_connect

    def spark_connect_connection(self) -> dict[str, Any]:
        """``SPARK_CONNECT_CONN_ID``'s connection (type ``spark_connect``): the server on call."""
        return {"conn_type": "spark_connect", "host": "127.0.0.1", "port": self.spark_connect.port}

    def open(self) -> None:
        """Start what the stack needs before Airflow's database is migrated."""

    def env(self, *, pg_base: str, airflow_db: str) -> dict[str, str]:
        """The executor's settings."""
        return {"AIRFLOW__CORE__EXECUTOR": "LocalExecutor"}

    def catalog_properties(self, *, pg_base: str, catalog_db: str) -> dict[str, str]:
        """The Iceberg connection's extra: pyiceberg's catalog properties, as ``IcebergHook`` reads them."""
        return {"type": "sql", "uri": f"{pg_base}/{catalog_db}", "warehouse": f"file://{self.root / 'warehouse'}"}

    def more_catalogs(self) -> dict[str, dict[str, str]]:
        """Further Iceberg connections to the same tables, by connection id: their extras."""
        return {}

    def worker_args(self, name: str) -> list[str]:
        raise ValueError(f"the {self.name} stack has no worker {name!r}")

    def storage_options(self) -> dict[str, Any] | None:
        """fsspec options for the tables' storage; ``None``: local disk."""
        return None

    def spark_master(self) -> str:
        """``spark_default``'s master: Spark inside the task's process tree."""
        return "local[1]"

    def close(self) -> None:
        """Stop the stack's own servers and clean up what it left outside the cluster's directory."""
        self.spark_connect.stop()


@dataclass
class ProductionStack(Stack):
    name: str = "production"
    workers: tuple[str, ...] = ("celery-worker-1", "celery-worker-2")
    seaweed: SeaweedFS | None = None
    spark: SparkStandalone | None = None

    @property
    def key_prefix(self) -> str:
        return f"eo-faults-{self.suffix}:"

    def open(self) -> None:
        if self.parallelism < len(self.workers):
            raise ValueError(f"the production stack needs a parallelism of at least {len(self.workers)}")
        _check_redis()
        # Lance's namespace server listens on a fixed port (9101, or the next free one) unless told
        # otherwise: two clusters starting at once raced for it and one weed exited. The harness
        # needs no Lance: port 0 disables it.
        self.seaweed = SeaweedFS(self.root / "seaweedfs", ports={"s3.port.lance": 0})
        try:
            self.seaweed.start()
        except Exception as exc:  # ServerUnavailable, or weed exiting at once
            tail = self.seaweed.log.read_text(errors="replace")[-1500:] if self.seaweed.log.exists() else ""
            raise StackUnavailable(f"SeaweedFS (weed mini) cannot start: {exc}\n{tail}") from exc
        self.servers["seaweedfs"] = self.seaweed
        self.catalog_proxy = Proxy("127.0.0.1", self.seaweed.ports["s3.port.iceberg"], http=True).start()
        self.spark = SparkStandalone(self.root / "spark")
        try:
            self.spark.start()
        except Exception as exc:
            raise StackUnavailable(f"the Spark standalone master and worker cannot start: {exc}") from exc
        self.servers["spark-standalone"] = self.spark

    def env(self, *, pg_base: str, airflow_db: str) -> dict[str, str]:
        pg_host = pg_base.split("://", 1)[1]
        return {
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
            "AIRFLOW__CELERY__BROKER_URL": REDIS_URL,
            "AIRFLOW__CELERY_BROKER_TRANSPORT_OPTIONS__GLOBAL_KEYPREFIX": self.key_prefix,
            # Airflow's default, set so that it says so in the config instead of warning in every log.
            "AIRFLOW__CELERY_BROKER_TRANSPORT_OPTIONS__VISIBILITY_TIMEOUT": "86400",
            "AIRFLOW__CELERY__RESULT_BACKEND": f"db+postgresql+psycopg2://{pg_host}/{airflow_db}",
            "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": str(TASK_QUEUED_TIMEOUT_S),
        }

    def catalog_properties(self, *, pg_base: str, catalog_db: str) -> dict[str, str]:
        """The REST catalog's URI, its OAuth2 client credential and the S3 FileIO properties, all in
        the extra: how a user configures the Iceberg provider's connection for such a catalog."""
        assert self.seaweed is not None, "open() first"
        return {**self.seaweed.catalog_properties(), MULTI_TABLE_COMMIT: "true"}

    def more_catalogs(self) -> dict[str, dict[str, str]]:
        assert self.seaweed is not None and self.catalog_proxy is not None, "open() first"
        return {
            PROXIED_ICEBERG_CONN_ID: {
                **self.seaweed.catalog_properties(),
                MULTI_TABLE_COMMIT: "true",
                "uri": self.catalog_proxy.url,
            }
        }

    def concurrency(self, name: str) -> int:
        """Each worker's slots; together they are the cluster's parallelism (3: 2 and 1)."""
        index = self.workers.index(name)
        share, extra = divmod(self.parallelism, len(self.workers))
        return share + (1 if index < extra else 0)

    def worker_args(self, name: str) -> list[str]:
        if name not in self.workers:
            return super().worker_args(name)
        return [
            "celery",
            "worker",
            # Distinct per cluster too: the worker refuses to start if one of its name answers.
            "--celery-hostname",
            f"{name}-{self.suffix}@%h",
            "--concurrency",
            str(self.concurrency(name)),
            "--pid",
            str(self.root / "airflow" / f"{name}.pid"),
            # Both workers serve logs on one port otherwise; the task logs are on this machine's disk.
            "--skip-serve-logs",
        ]

    def storage_options(self) -> dict[str, Any] | None:
        assert self.seaweed is not None
        return self.seaweed.s3fs_options()

    def spark_master(self) -> str:
        """The standalone master: the executors run under its worker, not in the task's process tree."""
        assert self.spark is not None, "open() first"
        return self.spark.url

    def close(self) -> None:
        super().close()
        if self.spark is not None:
            self.spark.stop()
        if self.catalog_proxy is not None:
            self.catalog_proxy.stop()
        if self.seaweed is not None:
            self.seaweed.stop()
        try:
            import redis

            client = redis.Redis.from_url(REDIS_URL, socket_timeout=5)
            keys = list(client.scan_iter(match=f"{self.key_prefix}*", count=500))
            if keys:
                client.delete(*keys)
            client.close()
        except Exception:  # the queues of a dead cluster only take space; never fail a teardown on them
            pass


def make_stack(name: str, root: Path, suffix: str, parallelism: int) -> Stack:
    if name == "local":
        return Stack(root, suffix, parallelism)
    if name == "production":
        return ProductionStack(root, suffix, parallelism)
    raise ValueError(f"unknown stack {name!r}; known: {STACKS}")


def kill_worker(pid: int) -> list[int]:
    """``kill -9`` of a Celery worker as losing its machine would: its process group and every
    process below it. The task processes are in process groups of their own (the task SDK's
    supervisor puts them there), so the group alone would leave them running. The pids killed."""
    try:
        below = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        below = []
    os.killpg(pid, signal.SIGKILL)
    killed = [pid]
    for proc in below:
        try:
            proc.kill()
            killed.append(proc.pid)
        except psutil.NoSuchProcess:
            pass
    return killed


def _check_redis() -> None:
    try:
        import redis

        client = redis.Redis.from_url(REDIS_URL, socket_timeout=5)
        client.ping()
        client.close()
    except Exception as exc:
        raise StackUnavailable(f"the Celery broker's Redis at {REDIS_URL} does not answer: {exc}") from exc
