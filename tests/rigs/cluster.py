"""Real replicated clusters for integration tests and benchmarks (processes, free ports).

`ReplicatedCluster(base_dir, brokers=3)` starts one controller process (or `controllers`
of them) and N broker processes (`python -m http_api.broker.server`), each on free ports
with its own data dir; brokers can be killed (-9), paused (SIGSTOP/SIGCONT), stopped with
SIGTERM (controlled shutdown) and restarted on the same port and data.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any, Optional

from tests.rigs.controllers import ROOT, ControllerCluster, free_port


READY_TIMEOUT_S = 180.0   # a process ready within this (polled: a healthy start takes seconds; 2 shared cores at load 30+ take minutes)


def http(method: str, url: str, body: Any = None, timeout: float = 30.0, raw: bytes | None = None,
         content_type: str = "application/json") -> tuple[int, Any]:
    """(status, JSON body or None); never raises for HTTP errors; (0, error text) when unreachable."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, method=method, data=data, headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            b = r.read()
            return r.status, (json.loads(b) if b else None)
    except urllib.error.HTTPError as e:
        b = e.read()
        try:
            return e.code, json.loads(b)
        except ValueError:
            return e.code, b.decode(errors="replace")
    except Exception as e:  # noqa: BLE001 - connection refused, timeout, reset
        return 0, str(e)


class ReplicatedCluster:
    """Controllers + brokers as real processes; see the module docstring."""

    def __init__(self, base_dir: str, brokers: int = 3, controllers: int = 1, broker_config: dict | None = None,
                 controller_args: list | None = None) -> None:
        self.base_dir = base_dir
        self.controllers = ControllerCluster(controllers, base_dir, extra_args=list(controller_args or []))
        self.broker_config = dict(broker_config or {})
        self.ports = {i: free_port() for i in range(1, brokers + 1)}
        self.kafka_ports = {i: free_port() for i in range(1, brokers + 1)}   # never Kafka's 9092
        self.procs: dict[int, subprocess.Popen] = {}

    # ---- lifecycle ------------------------------------------------------------------------

    def url(self, broker_id: int) -> str:
        return f"http://127.0.0.1:{self.ports[broker_id]}"

    @property
    def urls(self) -> list[str]:
        return [self.url(i) for i in self.ports]

    def kafka_address(self, broker_id: int) -> str:
        return f"127.0.0.1:{self.kafka_ports[broker_id]}"

    @property
    def kafka_bootstrap(self) -> str:
        """Kafka clients' bootstrap.servers: every broker's Kafka listener."""
        return ",".join(self.kafka_address(i) for i in self.kafka_ports)

    def start(self, timeout: float = READY_TIMEOUT_S) -> "ReplicatedCluster":
        """Controllers, then brokers; if any of them fails to come up, every process started
        so far is killed before the error propagates (`with` never reaches `__exit__` then)."""
        try:
            self.controllers.start_all()
            self.controllers.wait_active(timeout)
            for i in self.ports:
                self.start_broker(i, wait=False)
            for i in self.ports:
                self.wait_broker_ready(i, timeout)
        except BaseException:
            self.close()
            raise
        return self

    def start_broker(self, broker_id: int, wait: bool = True, timeout: float = READY_TIMEOUT_S) -> None:
        d = os.path.join(self.base_dir, f"broker-{broker_id}")
        os.makedirs(d, exist_ok=True)
        cfg = {"broker_id": broker_id, "http_port": self.ports[broker_id], "kafka_port": self.kafka_ports[broker_id],
               "log_dirs": [os.path.join(d, "logs")],
               "state_dir": d, "controller_urls": self.controllers.urls, **self.broker_config}
        cmd = [sys.executable, "-m", "http_api.broker.server", "--config-json", json.dumps(cfg),
               "--log-level", os.environ.get("KRAFTLOG_TEST_LOG_LEVEL", "INFO")]
        log = open(os.path.join(d, "broker.log"), "ab")
        self.procs[broker_id] = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                                 env={**os.environ, "PYTHONPATH": ROOT})
        log.close()
        if wait:
            self.wait_broker_ready(broker_id, timeout)

    def wait_broker_ready(self, broker_id: int, timeout: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            p = self.procs.get(broker_id)
            if p is not None and p.poll() is not None:
                raise RuntimeError(f"broker {broker_id} exited with {p.returncode}; see {self.log_path(broker_id)}")
            status, _ = http("GET", self.url(broker_id) + "/healthz", timeout=2)
            if status == 200:
                return
            time.sleep(0.05)
        raise TimeoutError(f"broker {broker_id} not ready within {timeout} s; see {self.log_path(broker_id)}")

    def log_path(self, broker_id: int) -> str:
        return os.path.join(self.base_dir, f"broker-{broker_id}", "broker.log")

    def signal(self, broker_id: int, sig: int) -> None:
        p = self.procs[broker_id]
        if p.poll() is None:
            p.send_signal(sig)

    def kill(self, broker_id: int) -> None:
        """kill -9: no controlled shutdown, nothing flushed."""
        p = self.procs.pop(broker_id, None)
        if p is not None and p.poll() is None:
            p.kill()
            p.wait(10)

    def stop_broker(self, broker_id: int, timeout: float = 30.0) -> int:
        """SIGTERM: controlled shutdown (leaderships move away), then a clean stop."""
        p = self.procs.pop(broker_id, None)
        if p is None:
            return 0
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
        try:
            return p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)
            raise

    def close(self) -> None:
        """kill -9 every broker (paused ones too) and every controller; never stops half way."""
        try:
            for p in self.procs.values():
                if p.poll() is None:
                    p.kill()   # SIGKILL also ends a SIGSTOPped process
            for p in self.procs.values():
                p.wait(10)
        finally:
            self.procs.clear()
            self.controllers.stop_all(signal.SIGKILL)

    def __enter__(self) -> "ReplicatedCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- metadata helpers ---------------------------------------------------------------

    def controller_metadata(self) -> dict:
        for url in self.controllers.urls:
            status, doc = http("GET", url + "/controller/v1/metadata?require_active=true", timeout=5)
            if status == 200:
                return doc
        raise RuntimeError("no active controller answered")

    def partition(self, topic: str, partition: int = 0) -> dict:
        doc = self.controller_metadata()
        t = next(t for t in doc["topics"] if t["name"] == topic)
        return next(p for p in t["partitions"] if p["partition"] == partition)

    def wait_for(self, pred, timeout: float, what: str, interval: float = 0.05):
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            try:
                last = pred()
            except Exception as e:  # noqa: BLE001 - transient while processes restart
                last = e
            if last and not isinstance(last, Exception):
                return last
            time.sleep(interval)
        raise AssertionError(f"timed out after {timeout} s waiting for {what} (last: {last!r})")

    def create_topic(self, name: str, partitions: int = 1, replication_factor: int = 3,
                     configs: Optional[dict] = None) -> dict:
        status, doc = http("POST", self.urls[0] + "/v1/topics", {
            "name": name, "partitions": partitions, "replication_factor": replication_factor,
            "configs": configs or {}})
        if status != 201:
            raise RuntimeError(f"create topic {name}: {status} {doc}")
        # every replica has applied the topic and followers have started fetching
        self.wait_for(lambda: all(len(p["isr"]) == replication_factor for p in self.partition_list(name)),
                      30, f"{name} fully in sync")
        return doc

    def partition_list(self, topic: str) -> list[dict]:
        doc = self.controller_metadata()
        t = next(t for t in doc["topics"] if t["name"] == topic)
        return t["partitions"]

    def read_all(self, topic: str, partition: int = 0, timeout: float = 30.0,
                 end_offset_min: int = 0) -> list[tuple[int, str]]:
        """Every committed record (offset, value) from the current leader. `end_offset_min`:
        read on until the records reach at least that offset (a leader elected moments ago
        starts from its own high watermark, which its followers' next fetches raise to the
        offsets the old leader acknowledged), failing after `timeout` if they never do."""
        out: list[tuple[int, str]] = []
        offset = 0
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            leader = self.partition(topic, partition)["leader"]
            if leader not in self.procs:
                time.sleep(0.1)
                continue
            status, doc = http("GET", f"{self.url(leader)}/v1/topics/{topic}/partitions/{partition}/records"
                                      f"?offset={offset}&max_bytes=1048576", timeout=10)
            if status != 200:
                time.sleep(0.1)
                continue
            for r in doc["records"]:
                out.append((r["offset"], r["value"]))
            offset = doc["next_offset"]
            if offset >= doc["high_watermark"]:
                if offset >= end_offset_min:
                    return out
                time.sleep(0.1)   # the new leader's high watermark has not reached it yet
        raise AssertionError(f"could not read {topic}-{partition} up to offset {end_offset_min} within {timeout} s "
                             f"(read up to {offset})")
