"""An in-process TCP proxy for network faults between kraftlog nodes.

One asyncio loop in a thread hosts every open `Proxy` of one `loop_name` (stopped and joined
when the last of them closes). The chaos cluster gives the raft links between controllers a
loop of their own (`RAFT_LOOP`): under load the shared loop fell behind a storm of HTTP
connections (brokers and probes retrying, accept queues full, 1,300+ accepted connections
whose clients had already given up), and a raft connection waited behind them longer than
pysyncobj's 1.5 s handshake timeout, redial after redial, so no controller was connected to
any other and none campaigned (raft/README.md, "A quorum that stops campaigning").
A proxy listens on a host:port and
forwards to one target port. It knows *who* is connecting: the peer's source port is looked
up in /proc/net/tcp and the owning process found among known pids (`resolver`), so faults
can be set per link (source label -> this proxy's destination), e.g. "broker-2" -> broker 1.

Rules, changeable at any time from any thread, for one source label or "*" (everyone):
- `cut`: existing connections severed, new ones closed at once (connection refused-like);
- `blackhole`: connections accepted, nothing forwarded either way (callers time out);
- `no_requests` / `no_answers`: one-way loss (client->server resp. server->client bytes
  dropped: with no answers a request is served but its caller never learns it);
- `delay_ms`: every chunk waits before being forwarded (slow link).

A dead target is mirrored: once the target process is gone (`target_down()`, called by the
chaos cluster when it kills the process, or a connect to the target refused), the proxy
stops listening, so new connections are refused as by a dead process's port (the port stays
bound meanwhile, so no other process can take it), and it listens again as soon as the target
accepts connections (probed every `TARGET_PROBE_INTERVAL_S`).
Before, it accepted and then closed them: a controller probing a killed broker saw
"connected, then closed" and fenced it through the slow silence path instead of the
immediate "unreachable" one (issue 24). A paused (SIGSTOPped) target still accepts (the
kernel completes the handshake), so the proxy keeps listening for it.
"""
from __future__ import annotations

import asyncio
import os
import re
import socket
import struct
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Optional

from deploy.ports import free_port  # noqa: F401 - re-exported for the harness

CHUNK_BYTES = 64 * 1024
TARGET_PROBE_INTERVAL_S = 0.05   # while the target is down: how often to check it listens again


DEFAULT_LOOP = "chaos-proxy"
RAFT_LOOP = "chaos-proxy-raft"


class _Loop:
    """The asyncio loop (in its own thread, with its own executor for naming connections)
    shared by every open Proxy of one name; counted users: when the last of them closes,
    its connections are cancelled, the loop stops and the thread is joined (nothing outlives
    the cluster that used it)."""

    _lock = threading.Lock()
    _instances: dict = {}   # loop name -> _Loop

    def __init__(self, name: str):
        self.name = name
        self.users = 0
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    @classmethod
    def acquire(cls, name: str = DEFAULT_LOOP) -> "_Loop":
        with cls._lock:
            if name not in cls._instances:
                cls._instances[name] = cls(name)
            cls._instances[name].users += 1
            return cls._instances[name]

    def release(self, timeout_s: float = 5.0) -> None:
        with _Loop._lock:
            self.users -= 1
            if self.users > 0:
                return
            if _Loop._instances.get(self.name) is self:
                del _Loop._instances[self.name]

        async def _cancel_all():
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        try:
            self.call(_cancel_all(), timeout_s)
        except Exception:
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout_s)
        if not self.thread.is_alive():
            self.loop.close()

    def call(self, coro, timeout: float = 10.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)


def _socket_inode(src_port: int, dst_host: str, dst_port: int) -> Optional[int]:
    """The inode of the TCP socket 127.0.0.1:src_port -> dst_host:dst_port, looked up by the
    kernel (NETLINK_SOCK_DIAG, one socket by its address: ~0.3 ms); None if there is none."""
    sockid = (struct.pack("!HH", src_port, dst_port) + socket.inet_aton("127.0.0.1") + bytes(12)
              + socket.inet_aton(dst_host) + bytes(12) + struct.pack("=III", 0, 0xFFFFFFFF, 0xFFFFFFFF))
    req = struct.pack("=BBBBI", socket.AF_INET, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF) + sockid
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as s:
        s.settimeout(1.0)
        s.send(struct.pack("=IHHII", 16 + len(req), _SOCK_DIAG_BY_FAMILY, 1, 1, 0) + req)   # NLM_F_REQUEST
        data = s.recv(65536)
    if struct.unpack_from("=IH", data)[1] != _SOCK_DIAG_BY_FAMILY:
        return None   # NLMSG_ERROR: no such socket
    return struct.unpack_from("=5I", data, 16 + 4 + 48)[4]   # inet_diag_msg's idiag_inode


_NETLINK_SOCK_DIAG, _SOCK_DIAG_BY_FAMILY = 4, 20


def pid_of_peer(peer_port: int, local_port: int, pids) -> Optional[int]:
    """The pid (among `pids`) owning the TCP socket 127.0.0.1:peer_port connected to our
    `local_port` (on 127.0.0.1 or 127.0.0.2), found by a sock_diag lookup (from
    /proc/net/tcp only where sock_diag is missing) and /proc/<pid>/fd (Linux). Reading
    /proc/net/tcp on a shared machine (9,000+ sockets) took 100-200 ms per connection, and
    the proxies' loop, which carries every raft link, waited for it: the raft election
    storms of chaos runs (issue 24)."""
    inode = None
    for host in ("127.0.0.1", "127.0.0.2"):
        try:
            found = _socket_inode(peer_port, host, local_port)
        except OSError:   # no sock_diag here: read the whole table
            return _pid_of_inode(_inode_from_proc_net_tcp(peer_port, local_port), pids)
        if found:
            inode = str(found)
            break
    # not found: the peer has closed it already (a short request); scanning /proc/net/tcp
    # for it would cost 100-200 ms and find nothing either
    return _pid_of_inode(inode, pids)


def _inode_from_proc_net_tcp(peer_port: int, local_port: int) -> Optional[str]:
    try:
        with open("/proc/net/tcp", "rb") as f:
            table = f.read()
    except OSError:
        return None
    m = re.search(rb"^ *\d+: [0-9A-F]{8}:%04X [0-9A-F]{8}:%04X (?:\S+ +){6}(\d+)" % (peer_port, local_port),
                  table, re.M)
    return m.group(1).decode() if m else None


def _pid_of_inode(inode: Optional[str], pids) -> Optional[int]:
    if inode is None:
        return None
    target = f"socket:[{inode}]"
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                        return pid
                except OSError:
                    continue
        except OSError:
            continue
    return None


@dataclass
class Rule:
    mode: str = "up"        # up | cut | blackhole
    requests: bool = True   # forward client -> server
    answers: bool = True    # forward server -> client
    delay_ms: int = 0

    def describe(self) -> str:
        parts = [self.mode]
        if not self.requests:
            parts.append("no-requests")
        if not self.answers:
            parts.append("no-answers")
        if self.delay_ms:
            parts.append(f"slow {self.delay_ms}ms")
        return ",".join(parts)


class Proxy:
    """Forwards `host`:`port` to 127.0.0.1:`target_port`, with per-source faults.

    `resolver(peer_port, local_port) -> label` names the connecting process ("broker-2",
    "controller-1", "client", ...); without one every connection is "client". `scheme` only
    names the URL: TLS bytes are forwarded as they are (the proxy never terminates TLS).
    `faults` counts what the rules did per (what, source label): connections refused or
    severed, chunks dropped or delayed (evidence that a fault reached the processes it targets).
    `loop_name` picks the loop (module docstring): proxies of different names never wait for
    each other's connections."""

    def __init__(self, target_port: int, name: str = "", host: str = "127.0.0.1", port: Optional[int] = None,
                 resolver: Optional[Callable[[int, int], str]] = None, scheme: str = "http",
                 loop_name: str = DEFAULT_LOOP):
        self.target_port = target_port
        self.scheme = scheme
        self.faults: Counter = Counter()   # (what, source label) -> count
        self.name = name or f"proxy->{target_port}"
        self.host = host
        self.resolver = resolver
        self.rules: dict[str, Rule] = {}
        self._conns: dict = {}          # writer -> source label
        self._lp = _Loop.acquire(loop_name)
        self._closed = False
        self._reopen_task: Optional[asyncio.Task] = None   # set while the target is down
        self._reserved: Optional[socket.socket] = None     # our port, bound only, while it is down
        try:
            self._server = self._lp.call(self._start(port or 0))
        except BaseException:
            self._closed = True
            self._lp.release()
            raise
        self.port = self._server.sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"

    async def _start(self, port: int):
        return await asyncio.start_server(self._handle, self.host, port, reuse_address=True)

    # ---- faults ------------------------------------------------------------------------

    def rule(self, source: str) -> Rule:
        return self.rules.get(source) or self.rules.get("*") or Rule()

    def set_rule(self, source: str = "*", **kw) -> None:
        r = self.rules.get(source) or Rule()
        for k, v in kw.items():
            setattr(r, k, v)
        self.rules[source] = r
        if r.mode == "cut" and not self._closed:
            self._lp.loop.call_soon_threadsafe(self._sever, source)

    def cut(self, source: str = "*") -> None:
        self.set_rule(source, mode="cut")

    def blackhole(self, source: str = "*") -> None:
        self.set_rule(source, mode="blackhole")

    def one_way(self, source: str = "*", requests: bool = True, answers: bool = True) -> None:
        self.set_rule(source, requests=requests, answers=answers)

    def slow(self, delay_ms: int, source: str = "*") -> None:
        self.set_rule(source, delay_ms=delay_ms)

    def heal(self, source: Optional[str] = None) -> None:
        if source is None:
            self.rules.clear()
        else:
            self.rules.pop(source, None)

    def state(self) -> str:
        return "; ".join(f"{s}: {r.describe()}" for s, r in sorted(self.rules.items())) or "up"

    # ---- the target process's life ------------------------------------------------------

    @property
    def listening(self) -> bool:
        """False while the target is down (new connections are refused)."""
        return self._server is not None

    def target_down(self) -> None:
        """The target process is dead: refuse new connections until it listens again."""
        if not self._closed:
            self._lp.call(self._stop_listening())

    async def _stop_listening(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
            self.faults[("target-down", "*")] += 1
            self._reserve_port()
        if self._reopen_task is None and not self._closed:
            self._reopen_task = asyncio.ensure_future(self._listen_when_target_listens())

    async def _listen_when_target_listens(self) -> None:
        try:
            while not self._closed:
                if await self._target_accepts():
                    self._release_port()
                    try:
                        server = await self._start(self.port)
                    except OSError:   # our port briefly held elsewhere: try again
                        pass
                    else:
                        if self._closed:
                            server.close()
                        else:
                            self._server = server
                        return
                await asyncio.sleep(TARGET_PROBE_INTERVAL_S)
        finally:
            self._reopen_task = None

    def _reserve_port(self) -> None:
        """Keep our port bound, not listening, while the target is down: connects are refused
        (RST) as by a dead process's port, and no other process can take the port meanwhile."""
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError:   # taken in between: refused anyway while it is not ours
            sock.close()
            return
        self._reserved = sock

    def _release_port(self) -> None:
        if self._reserved is not None:
            self._reserved.close()
            self._reserved = None

    async def _target_accepts(self) -> bool:
        try:
            _, w = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", self.target_port), 2.0)
        except (OSError, asyncio.TimeoutError):
            return False
        w.transport.abort()
        return True

    def close(self) -> None:
        """Stop listening and sever every connection; the last proxy closed stops the loop."""
        if self._closed:
            return
        self._closed = True

        async def _close():
            if self._reopen_task is not None:
                self._reopen_task.cancel()
            if self._server is not None:
                self._server.close()
                self._server = None
            self._release_port()
            self._sever("*", count=False)
        try:
            self._lp.call(_close())
        except Exception:
            pass
        self._lp.release()

    # ---- forwarding --------------------------------------------------------------------

    def _sever(self, source: str, count: bool = True) -> None:
        for w, label in list(self._conns.items()):
            if source == "*" or label == source:
                try:
                    w.transport.abort()
                except Exception:
                    pass
                if self._conns.pop(w, None) is not None and count:
                    self.faults[("severed", label)] += 1   # both sockets of a forwarded connection

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        label = "client"
        if self.resolver is not None:
            peer = writer.get_extra_info("peername")
            try:   # off the loop: every proxied link (raft included) shares this loop
                label = await asyncio.get_running_loop().run_in_executor(None, self.resolver, peer[1], self.port)
            except Exception:
                label = "unknown"
        if self.rule(label).mode == "cut":
            self.faults[("refused", label)] += 1
            writer.transport.abort()
            return
        try:
            t_reader, t_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError as e:
            writer.transport.abort()
            if isinstance(e, ConnectionRefusedError):   # the target died by itself or restarts
                await self._stop_listening()
            return
        self._conns[writer] = label
        self._conns[t_writer] = label
        try:
            await asyncio.gather(self._pump(reader, t_writer, label, True),
                                 self._pump(t_reader, writer, label, False))
        finally:
            for w in (writer, t_writer):
                self._conns.pop(w, None)
                try:
                    w.transport.abort()
                except Exception:
                    pass

    async def _pump(self, reader, writer, label: str, request_direction: bool) -> None:
        try:
            while True:
                data = await reader.read(CHUNK_BYTES)
                if not data:
                    break
                r = self.rule(label)
                if r.delay_ms:
                    self.faults[("delayed", label)] += 1
                    await asyncio.sleep(r.delay_ms / 1000)
                    r = self.rule(label)
                if r.mode == "cut":
                    break
                if r.mode == "blackhole" or not (r.requests if request_direction else r.answers):
                    self.faults[("dropped", label)] += 1
                    continue
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError, asyncio.CancelledError):
            pass
        finally:
            try:
                writer.transport.abort()
            except Exception:
                pass
