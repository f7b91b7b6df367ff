"""An in-process TCP proxy for network faults between kraftlog nodes.

One asyncio loop in a daemon thread hosts every `Proxy`. A proxy listens on a free port and
forwards to one target port. Faults, changeable at any time from any thread:

- `cut()` / `heal()`: existing connections are severed and new ones closed at once
  (connection refused, as a dead host behind a firewall rejecting);
- `blackhole()`: connections are accepted but nothing is forwarded either way (a
  partition where packets vanish: callers hit their timeouts);
- `one_way(up=False)` drops client->server bytes (requests never arrive);
  `one_way(down=False)` drops server->client bytes (requests are served, answers lost:
  outcomes unknown to the caller);
- `slow(delay_ms)`: every chunk waits `delay_ms` before being forwarded.
"""
from __future__ import annotations

import asyncio
import socket
import threading
from typing import Optional

CHUNK_BYTES = 64 * 1024


class _Loop:
    _lock = threading.Lock()
    _instance: Optional["_Loop"] = None

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="chaos-proxy", daemon=True)
        self.thread.start()

    @classmethod
    def get(cls) -> "_Loop":
        with cls._lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    def call(self, coro, timeout: float = 10.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proxy:
    """Forwards 127.0.0.1:`port` to 127.0.0.1:`target_port`, with injectable faults."""

    def __init__(self, target_port: int, name: str = "", port: Optional[int] = None):
        self.target_port = target_port
        self.name = name or f"proxy->{target_port}"
        self.mode = "up"          # up | cut | blackhole
        self.up = True            # forward client -> server
        self.down = True          # forward server -> client
        self.delay_ms = 0
        self._conns: set = set()
        self._lp = _Loop.get()
        self._server = self._lp.call(self._start(port or 0))
        self.port = self._server.sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _start(self, port: int):
        return await asyncio.start_server(self._handle, "127.0.0.1", port, reuse_address=True)

    # ---- faults (thread-safe: they only set attributes read by the pumps) --------------

    def heal(self) -> None:
        self.mode, self.up, self.down, self.delay_ms = "up", True, True, 0

    def cut(self) -> None:
        self.mode = "cut"
        self._lp.loop.call_soon_threadsafe(self._sever)

    def blackhole(self) -> None:
        self.mode = "blackhole"

    def one_way(self, up: bool = True, down: bool = True) -> None:
        self.up, self.down = up, down

    def slow(self, delay_ms: int) -> None:
        self.delay_ms = delay_ms

    def state(self) -> str:
        parts = [self.mode]
        if not self.up:
            parts.append("no-requests")
        if not self.down:
            parts.append("no-answers")
        if self.delay_ms:
            parts.append(f"slow {self.delay_ms}ms")
        return ",".join(parts)

    def close(self) -> None:
        async def _close():
            self._server.close()
            self._sever()
        try:
            self._lp.call(_close())
        except Exception:
            pass

    # ---- forwarding --------------------------------------------------------------------

    def _sever(self) -> None:
        for w in list(self._conns):
            try:
                w.transport.abort()
            except Exception:
                pass
        self._conns.clear()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.mode == "cut":
            writer.transport.abort()
            return
        try:
            t_reader, t_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        self._conns.update({writer, t_writer})
        try:
            await asyncio.gather(self._pump(reader, t_writer, "up"), self._pump(t_reader, writer, "down"))
        finally:
            for w in (writer, t_writer):
                self._conns.discard(w)
                try:
                    w.transport.abort()
                except Exception:
                    pass

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, direction: str) -> None:
        try:
            while True:
                data = await reader.read(CHUNK_BYTES)
                if not data:
                    break
                if self.delay_ms:
                    await asyncio.sleep(self.delay_ms / 1000)
                if self.mode == "cut":
                    break
                if self.mode == "blackhole" or not (self.up if direction == "up" else self.down):
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
