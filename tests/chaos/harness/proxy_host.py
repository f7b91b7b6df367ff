"""Chaos proxies in a process of their own (`ProxyHost`), driven from the harness by
`RemoteProxy`, which has `Proxy`'s interface.

Why: in the harness process the proxies shared one interpreter (one GIL) with the workload
clients, the checker and the nemeses' file work (lost-tail copies a broker's logs, torn-tail
tears segment tails). In the 1,008-fault run at 7ea0488 the two faults of those kinds over
3 s each held 2.2-2.3 s without a raft leader: the raft leader's thread ticked on time but
heard the candidates' RequestVote about 1 s late, and the other controllers saw each other's
terms 0.1-0.3 s late, while the harness process worked on files (docs/AVAILABILITY.md). A
real network does not wait for the test's own Python work; the proxies stand in for it, so
they run where that work cannot delay them: one process per `ProxyHost` (the chaos cluster
gives the raft links one and the HTTP links another, as the loops were kept apart before,
proxy.py), at a raised scheduling priority where the OS allows it
(`PROXY_HOST_NICE_DELTA`), dying with the harness (PR_SET_PDEATHSIG).

Naming connections: the host resolves a connection's source port to a pid (proxy.py's
`pid_of_peer`) and the pid to a label from the map the harness pushes with `set_labels`
whenever a process starts or dies (`ChaosCluster._spawn` / `kill`), before the new process
can open any connection.

The harness talks to a host over a multiprocessing pipe, one request at a time (a lock):
("open", kwargs) -> (proxy id, port); (method, proxy id, args) -> result; errors come back
as exceptions and are raised in the caller.
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from collections import Counter
from typing import Optional

PROXY_HOST_NICE_DELTA = -5       # the relay stands in for the network: scheduled ahead of test work
PROXY_HOST_CALL_TIMEOUT_S = 30.0  # one command's answer (a host that stops answering is a harness bug)


def _serve(conn, labels_initial: dict, loop_name: str) -> None:
    """The host process: owns the Proxy objects, answers the harness's commands."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
    except Exception:
        pass
    try:
        os.setpriority(os.PRIO_PROCESS, 0, os.getpriority(os.PRIO_PROCESS, 0) + PROXY_HOST_NICE_DELTA)
    except OSError:
        pass   # not allowed here: the process of its own is the main gain
    from tests.chaos.harness.proxy import Proxy, pid_of_peer

    labels: dict[int, str] = dict(labels_initial)

    def resolver(peer_port: int, local_port: int) -> str:
        snapshot = dict(labels)
        return snapshot.get(pid_of_peer(peer_port, local_port, list(snapshot)), "client")

    proxies: dict[int, Proxy] = {}
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            break
        op = msg[0]
        try:
            if op == "open":
                kw = dict(msg[1])
                resolve = kw.pop("resolve", False)
                p = Proxy(resolver=resolver if resolve else None, loop_name=loop_name, **kw)
                proxies[id(p)] = p
                result = (id(p), p.port)
            elif op == "labels":
                labels.clear()
                labels.update(msg[1])
                result = None
            elif op == "shutdown":
                for p in proxies.values():
                    p.close()
                conn.send(("ok", None))
                break
            else:
                p = proxies[msg[1]]
                args = msg[2]
                if op == "faults":
                    result = dict(p.faults)
                elif op == "listening":
                    result = p.listening
                elif op == "rules":
                    result = {s: (r.mode, r.requests, r.answers, r.delay_ms) for s, r in p.rules.items()}
                else:   # set_rule, cut, blackhole, one_way, slow, heal, state, target_down, close
                    method, args, kwargs = getattr(p, op), args[0], args[1]
                    result = method(*args, **kwargs)
                    if op == "close":
                        proxies.pop(msg[1], None)
            conn.send(("ok", result))
        except BaseException as e:   # answered, never fatal to the host
            try:
                conn.send(("error", repr(e)))
            except Exception:
                break


class ProxyHost:
    """One proxy process (see module docstring). Thread-safe: calls are serialised."""

    def __init__(self, name: str, loop_name: str, labels: Optional[dict] = None):
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self.name = name
        self._proc = ctx.Process(target=_serve, args=(child, dict(labels or {}), loop_name),
                                 name=name, daemon=True)
        self._proc.start()
        child.close()
        self._lock = threading.Lock()
        self._closed = False

    @property
    def pid(self) -> Optional[int]:
        return self._proc.pid

    def call(self, *msg):
        with self._lock:
            if self._closed:
                raise RuntimeError(f"proxy host {self.name} is closed")
            self._conn.send(msg)
            if not self._conn.poll(PROXY_HOST_CALL_TIMEOUT_S):
                raise TimeoutError(f"proxy host {self.name} (pid {self.pid}) did not answer {msg[0]} "
                                   f"within {PROXY_HOST_CALL_TIMEOUT_S}s")
            status, result = self._conn.recv()
        if status != "ok":
            raise RuntimeError(f"proxy host {self.name}: {msg[0]} failed: {result}")
        return result

    def set_labels(self, labels: dict) -> None:
        """pid -> source label ("broker-2") of every process the proxies may see connect."""
        self.call("labels", dict(labels))

    def open(self, target_port: int, name: str = "", host: str = "127.0.0.1", port: Optional[int] = None,
             scheme: str = "http", resolve: bool = False) -> "RemoteProxy":
        return RemoteProxy(self, target_port, name, host, port, scheme, resolve)

    def close(self) -> None:
        if self._closed:
            return
        try:
            self.call("shutdown")
        except Exception:
            pass
        with self._lock:
            self._closed = True
            self._conn.close()
        self._proc.join(5)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)


class RemoteProxy:
    """`Proxy`'s interface (rules, target_down, faults, listening, close) for a proxy living
    in a `ProxyHost`."""

    def __init__(self, host: ProxyHost, target_port: int, name: str, bind_host: str, port: Optional[int],
                 scheme: str, resolve: bool):
        self._host = host
        self.target_port = target_port
        self.name = name or f"proxy->{target_port}"
        self.host = bind_host
        self.scheme = scheme
        self._id, self.port = host.call("open", dict(target_port=target_port, name=self.name, host=bind_host,
                                                     port=port, scheme=scheme, resolve=resolve))
        self._closed = False
        self._faults_at_close: Counter = Counter()

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"

    def _do(self, op: str, *args, **kwargs):
        return self._host.call(op, self._id, (args, kwargs))

    @property
    def faults(self) -> Counter:
        if self._closed:
            return Counter(self._faults_at_close)
        return Counter(self._do("faults"))

    @property
    def listening(self) -> bool:
        return self._do("listening")

    @property
    def rules(self) -> dict:
        return self._do("rules")

    def set_rule(self, source: str = "*", **kw) -> None:
        self._do("set_rule", source, **kw)

    def cut(self, source: str = "*") -> None:
        self._do("cut", source)

    def blackhole(self, source: str = "*") -> None:
        self._do("blackhole", source)

    def one_way(self, source: str = "*", requests: bool = True, answers: bool = True) -> None:
        self._do("one_way", source, requests=requests, answers=answers)

    def slow(self, delay_ms: int, source: str = "*") -> None:
        self._do("slow", delay_ms, source)

    def heal(self, source: Optional[str] = None) -> None:
        self._do("heal", source)

    def state(self) -> str:
        return self._do("state")

    def target_down(self) -> None:
        self._do("target_down")

    def close(self) -> None:
        if self._closed:
            return
        try:
            self._faults_at_close = self.faults
            self._do("close")
        except Exception:
            pass
        self._closed = True
