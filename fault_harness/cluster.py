"""A real Airflow deployment in a temporary directory, for the fault-injection harness and benchmarks.

    api-server ─┐
    scheduler ──┼── Airflow's metadata DB: a fresh database on the PostgreSQL at 127.0.0.1:5432
    (LocalExecutor: task processes; or CeleryExecutor and two Celery workers: ``stacks``)
    dag-processor, triggerer
    meta store ─── its own PostgreSQL server (initdb + pg_ctl in the temp dir), so that stopping it
                   leaves Airflow's own database running
    Iceberg catalog ─── a SQL catalog and local files, or SeaweedFS's REST catalog and S3 (``stacks``)

Every component is a subprocess in its own session (so ``kill -9`` of a component takes its children
with it, as losing a machine would), with its log in ``<root>/logs/<name>.log``. Nothing here
imports Airflow: the process that drives the harness may have imported Airflow with another
configuration (pytest runs every suite in one process), so Airflow is reached only through its CLI
and its metadata database is read with plain SQL.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from airflow_provider_exactly_once.runtime.assembly import FAULT_HOOK_ENV_VAR
from demo.fault_plan import FAULT_HOOK_FACTORY, FAULT_PLAN_ENV_VAR
from fault_harness.layout import SPARK_CONNECT_CONN_ID
from fault_harness.stacks import Stack, kill_worker, make_stack

REPO = Path(__file__).resolve().parents[1]
PG_ADMIN_URL = os.environ.get("EO_TEST_PG_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432/test")
COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
META_CONN_ID = "exactly_once_default"
ICEBERG_CONN_ID = "iceberg_faults"
RECOVERY_DAG_ID = "exactly_once_recovery"
#: The recovery DAG's orphan grace while runs are in flight. It must outlast the longest wait of a
#: finished write for its persist (the product's contract, 6 h by default): the recovery run each
#: scheduler start triggers would otherwise delete a write whose persist is still queued, and the
#: epoch's run would fail (seen with 20 s: a persist queued 100 s behind 60 runs on 3 slots).
IN_FLIGHT_ORPHAN_GRACE_S = 900
#: Once every run has ended no write awaits its persist, and ``eo-sink gc`` may use a short grace.
FINAL_ORPHAN_GRACE_S = 20
PIPELINES_DAG_FILE = """\
# The airflow DAGs of the fault-injection harness: one per JSON file of $EO_FAULTS_PIPELINES.
import json
import os
from pathlib import Path

from fault_harness.pipeline import build

for _path in sorted(Path(os.environ["EO_FAULTS_PIPELINES"]).glob("*.json")):
    _params = json.loads(_path.read_text(encoding="utf-8"))
    globals()[_params["dag_id"]] = build(_params)
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _pg_bin() -> Path:
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    if not candidates:
        raise RuntimeError("no PostgreSQL server binaries under /usr/lib/postgresql/*/bin (pg_ctl, initdb)")
    return candidates[-1].parent


class PostgresServer:
    """A private PostgreSQL server (the meta store) that the harness may stop and start at will.

    Run as user ``postgres`` when this process is root (``initdb`` refuses root), trust auth, on a
    free port, its data and socket directories under ``root``.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.data = root / "data"
        self.port = free_port()
        self.bin = _pg_bin()
        self.log = root / "postgres.log"
        self._outages = 0
        self._outage_lock = threading.Lock()

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        command = [str(self.bin / args[0]), *args[1:]]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        return subprocess.run(command, capture_output=True, text=True, check=check, timeout=120)

    def init(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        conf = self.data / "postgresql.conf"
        with conf.open("a", encoding="utf-8") as out:
            out.write(
                f"\nport = {self.port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{self.root}'\n"
                "fsync = off\nmax_connections = 200\nshared_buffers = 32MB\n"
            )
        self.start()
        admin = sa.create_engine(self.url("postgres"), isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(sa.text("CREATE DATABASE meta"))
        admin.dispose()

    def url(self, database: str = "meta") -> str:
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start")

    def stop(self, mode: str = "immediate") -> None:
        """``immediate`` is the crash-like stop: connections are cut, nothing is flushed politely."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop", check=False)

    def running(self) -> bool:
        return self._run("pg_ctl", "-D", str(self.data), "status", check=False).returncode == 0

    @contextmanager
    def outage(self, mode: str = "immediate") -> Iterator[bool]:
        """The server down for the block. Pipelines run their actions in threads and share this
        server, so outages can overlap: they merge, the first stopping it and the last starting it
        again (a second ``pg_ctl start`` of a running server fails). Yields whether this block stopped it."""
        with self._outage_lock:
            self._outages += 1
            first = self._outages == 1
            if first:
                self.stop(mode)
        try:
            yield first
        finally:
            with self._outage_lock:
                self._outages -= 1
                if self._outages == 0:
                    self.start()


@dataclass
class Cluster:
    """One Airflow deployment; build with ``Cluster.create`` (or ``cluster()``), end with ``close``."""

    root: Path
    airflow_db: str
    meta: PostgresServer
    catalog_db: str
    api_port: int
    env: dict[str, str]
    stack: Stack
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    log_files: dict[str, Any] = field(default_factory=dict)
    _engine: sa.Engine | None = None

    # -- building ----------------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        root: Path | None = None,
        *,
        parallelism: int = 3,
        orphan_grace_s: int = IN_FLIGHT_ORPHAN_GRACE_S,
        extra_env: Mapping[str, str] | None = None,
        stack: str = "local",
    ) -> Cluster:
        root = Path(tempfile.mkdtemp(prefix="eo-faults-")) if root is None else root
        root.mkdir(parents=True, exist_ok=True)
        os.chmod(root, 0o755)
        for sub in ("airflow", "dags", "logs", "landing", "warehouse", "pipelines"):
            (root / sub).mkdir(exist_ok=True)
        suffix = uuid.uuid4().hex[:10]
        airflow_db, catalog_db = f"eo_faults_airflow_{suffix}", f"eo_faults_catalog_{suffix}"
        admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{airflow_db}"'))
            conn.execute(sa.text(f'CREATE DATABASE "{catalog_db}"'))
        admin.dispose()
        pg_base = PG_ADMIN_URL.rsplit("/", 1)[0]
        meta = PostgresServer(root / "meta-pg")
        api_port = free_port()
        platform = make_stack(stack, root, suffix, parallelism)
        venv_bin = str(Path(sys.executable).parent)
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "EXACTLY_ONCE", "EO_"))},
            "AIRFLOW_HOME": str(root / "airflow"),
            "AIRFLOW__CORE__DAGS_FOLDER": str(root / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
            "AIRFLOW__CORE__PARALLELISM": str(parallelism),
            "AIRFLOW__CORE__LAZY_DISCOVER_PROVIDERS": "False",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            # A loaded 2-core machine parses the pipelines' DAG file in more than the default 30 s.
            "AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT": "300",
            "AIRFLOW__DAG_PROCESSOR__DAG_FILE_PROCESSOR_TIMEOUT": "300",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{api_port}/execution/",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"{pg_base}/{airflow_db}",
            # No async PostgreSQL driver (asyncpg) is locked: Airflow's async engine serves only API
            # endpoints the harness never calls (a run's "wait" endpoint, multi-team lookups), so it
            # gets a throwaway SQLite file rather than a new dependency.
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": f"sqlite+aiosqlite:///{root / 'airflow' / 'unused-async.db'}",
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(api_port),
            "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{api_port}",
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(16),
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "40",
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "5",
            "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "15",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": "30",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "15",
            "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "2",
            "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(root / "logs" / "tasks"),
            # The scheduler's log server: Airflow's fixed 8793 would meet another cluster's on this machine.
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__EXACTLY_ONCE__RECOVERY_SCHEDULE": "none",
            "AIRFLOW__EXACTLY_ONCE__RECOVERY_ORPHAN_GRACE_SECONDS": str(orphan_grace_s),
            f"AIRFLOW_CONN_{META_CONN_ID.upper()}": json.dumps({"conn_type": "exactly_once_meta", "host": meta.url()}),
            FAULT_HOOK_ENV_VAR: FAULT_HOOK_FACTORY,
            FAULT_PLAN_ENV_VAR: str(root / "fault-plan.json"),
            "EO_FAULTS_PIPELINES": str(root / "pipelines"),
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p),
            "PATH": venv_bin + os.pathsep + os.environ.get("PATH", ""),
        }
        cluster = cls(root, airflow_db, meta, catalog_db, api_port, env, platform)
        cluster.write_plan([])
        try:
            platform.open()
            catalog = platform.catalog_properties(pg_base=pg_base, catalog_db=catalog_db)
            env.update(platform.env(pg_base=pg_base, airflow_db=airflow_db))
            env["AIRFLOW_CONN_SPARK_DEFAULT"] = json.dumps({"conn_type": "spark", "host": platform.spark_master()})
            env[f"AIRFLOW_CONN_{SPARK_CONNECT_CONN_ID.upper()}"] = json.dumps(platform.spark_connect_connection())
            env[f"AIRFLOW_CONN_{ICEBERG_CONN_ID.upper()}"] = json.dumps({"conn_type": "iceberg", "extra": catalog})
            for conn_id, extra in platform.more_catalogs().items():
                env[f"AIRFLOW_CONN_{conn_id.upper()}"] = json.dumps({"conn_type": "iceberg", "extra": extra})
            env.update(extra_env or {})
            meta.init()
            (root / "dags" / "exactly_once_recovery.py").write_text(
                "from airflow_provider_exactly_once.recovery.dag import recovery_dag\n\ndag = recovery_dag()\n",
                encoding="utf-8",
            )
            # One DAG file builds every pipeline's DAG from its JSON (harness.start_dag): one parse
            # registers all of them, where a file per DAG would cost a parse (seconds) per pipeline.
            (root / "dags" / "eo_faults_pipelines.py").write_text(PIPELINES_DAG_FILE, encoding="utf-8")
            cluster.airflow("db", "migrate", timeout=600)
        except BaseException:
            cluster.close()
            raise
        return cluster

    @property
    def catalog_properties(self) -> dict[str, str]:
        extra: dict[str, str] = json.loads(self.env[f"AIRFLOW_CONN_{ICEBERG_CONN_ID.upper()}"])["extra"]
        return extra

    # -- the fault plan ------------------------------------------------------------------------------

    def write_plan(self, rules: list[dict[str, Any]]) -> None:
        """Replace the fault plan every task try reads (atomically: a half-written plan is refused)."""
        path = Path(self.env[FAULT_PLAN_ENV_VAR])
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(rules, indent=1), encoding="utf-8")
        tmp.replace(path)

    # -- components ----------------------------------------------------------------------------------

    @property
    def components(self) -> tuple[str, ...]:
        """Every component ``start``, ``kill``, ``stop`` and ``restart`` know, the stack's included."""
        return (*COMPONENTS, *self.stack.workers, *self.stack.servers)

    def start(self, name: str) -> None:
        if name not in self.components:
            raise ValueError(f"unknown component {name!r}; known: {self.components}")
        if name in self.stack.servers:
            server = self.stack.servers[name]
            if not server.running:
                server.start()  # on the ports it had: clients built before keep reaching it
            return
        if name in self.procs and self.procs[name].poll() is None:
            return
        args = {
            "api-server": ["api-server", "--port", str(self.api_port), "--host", "127.0.0.1"],
            "scheduler": ["scheduler", "--skip-serve-logs"],
            "dag-processor": ["dag-processor"],
            "triggerer": ["triggerer", "--skip-serve-logs"],
        }.get(name) or self.stack.worker_args(name)
        out = (self.root / "logs" / f"{name}.log").open("ab")
        self.log_files[name] = out
        self.procs[name] = subprocess.Popen(
            [str(Path(sys.executable).with_name("airflow")), *args],
            env=self.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=self.root,
        )

    def start_all(self) -> None:
        for name in (*COMPONENTS, *self.stack.workers):
            self.start(name)
        self.wait_for_api()

    def wait_for_api(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            proc = self.procs.get("api-server")
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"the api-server exited ({proc.returncode}); see {self.root}/logs/api-server.log")
            try:
                with socket.create_connection(("127.0.0.1", self.api_port), timeout=1):
                    return
            except OSError:
                time.sleep(1)
        raise RuntimeError(f"the api-server did not listen on {self.api_port} within {timeout} s")

    def kill(self, name: str) -> list[int]:
        """``kill -9`` of a component and every process of its session (its task processes too, for
        LocalExecutor's); of a Celery worker, every process below it as well (``kill_worker``).
        The pids killed (the component's own first)."""
        if name in self.stack.servers:
            server = self.stack.servers[name]
            pid = server.process.pid if server.running else None
            server.kill()
            return [] if pid is None else [pid]
        proc = self.procs.get(name)
        if proc is None or proc.poll() is not None:
            return []
        if name in self.stack.workers:
            killed = kill_worker(proc.pid)
        else:
            os.killpg(proc.pid, signal.SIGKILL)
            killed = [proc.pid]
        proc.wait(timeout=30)
        return killed

    def stop(self, name: str, timeout: float = 30) -> None:
        if name in self.stack.servers:
            self.stack.servers[name].stop()
            return
        proc = self.procs.get(name)
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            if name in self.stack.workers:
                kill_worker(proc.pid)  # its task processes too, which are not in its group
            else:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        except ProcessLookupError:
            pass

    def restart(self, name: str, *, hard: bool = True) -> None:
        self.kill(name) if hard else self.stop(name)
        self.start(name)

    def alive(self, name: str) -> bool:
        if name in self.stack.servers:
            return bool(self.stack.servers[name].running)
        proc = self.procs.get(name)
        return proc is not None and proc.poll() is None

    # -- the CLI and the metadata DB -------------------------------------------------------------------

    def airflow(self, *args: str, timeout: float = 180) -> str:
        return self.command("airflow", *args, timeout=timeout)

    def eo_sink(self, *args: str, timeout: float = 300) -> str:
        """The package's operator CLI (docs/cli.md) against this deployment's connections."""
        return self.command("eo-sink", *args, timeout=timeout)

    def command(self, script: str, *args: str, timeout: float = 180) -> str:
        """A console script of the venv, run in the deployment's environment; its stdout."""
        done = subprocess.run(
            [str(Path(sys.executable).with_name(script)), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.root,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{script} {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
        return done.stdout

    @property
    def engine(self) -> sa.Engine:
        if self._engine is None:
            self._engine = sa.create_engine(self.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"], pool_pre_ping=True)
        return self._engine

    def query(self, sql: str, **params: Any) -> list[sa.Row[Any]]:
        with self.engine.connect() as conn:
            return list(conn.execute(sa.text(sql), params))

    def dag_runs(self, dag_id: str) -> list[sa.Row[Any]]:
        return self.query(
            "select run_id, state, run_type, data_interval_start, clear_number from dag_run where dag_id = :d "
            "order by data_interval_start",
            d=dag_id,
        )

    def task_instances(self, dag_id: str, task_id: str | None = None) -> list[sa.Row[Any]]:
        sql = "select run_id, task_id, state, try_number, pid, hostname from task_instance where dag_id = :d"
        if task_id is not None:
            return self.query(sql + " and task_id = :t", d=dag_id, t=task_id)
        return self.query(sql, d=dag_id)

    def dag_registered(self, dag_id: str) -> bool:
        return bool(self.query("select 1 from dag where dag_id = :d and is_stale is not true", d=dag_id))

    def wait_for_dag(self, dag_id: str, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.dag_registered(dag_id):
                return
            self.check_alive()
            time.sleep(2)
        raise TimeoutError(f"DAG {dag_id} was not parsed within {timeout} s; see {self.root}/logs/dag-processor.log")

    def check_alive(self, names: tuple[str, ...] | None = None) -> None:
        for name in (*COMPONENTS, *self.stack.workers) if names is None else names:
            proc = self.procs.get(name)
            if proc is not None and proc.poll() is not None and proc.returncode not in (-signal.SIGKILL,):
                raise RuntimeError(f"{name} exited ({proc.returncode}); see {self.root}/logs/{name}.log")

    # -- the end -----------------------------------------------------------------------------------------

    def close(self, *, keep_root: bool = False) -> None:
        """Stop everything and drop the databases; safe to call twice and after a failed start."""
        for name in reversed((*COMPONENTS, *self.stack.workers)):
            with suppress(Exception):  # keep tearing down whatever else there is
                self.stop(name, timeout=20)
        with suppress(Exception):
            self.stack.close()
        for out in self.log_files.values():
            out.close()
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None
        with suppress(Exception):
            self.meta.stop("fast")
        admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as conn:
                for db in (self.airflow_db, self.catalog_db):
                    conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)'))
        finally:
            admin.dispose()
        if not keep_root:
            shutil.rmtree(self.root, ignore_errors=True)


@contextmanager
def cluster(root: Path | None = None, *, keep_root: bool = False, **options: Any) -> Iterator[Cluster]:
    """A started cluster, torn down at the end even on failure."""
    c = Cluster.create(root, **options)
    try:
        c.start_all()
        yield c
    finally:
        c.close(keep_root=keep_root)
