"""BrokerHeartbeatThread: a broker's periodic controller heartbeats, sent from a thread of
their own (issue 25; Kafka's BrokerLifecycleManager runs on its own thread for the same
reason).

Heartbeats sent from the broker's event loop wait behind whatever holds the loop. After a
kill -9 at 100,000 partitions a survivor's loop turned every 200 ms - 7 s for tens of seconds
(applying 33,000 leaderships, answering full fetches, scanning its led partitions); its
heartbeats came late or timed out, its own isolation rule (issue 24 part D) then took it for
cut off and suspended its leaderships, and the controller fenced it by session expiry while it
was alive and serving. This thread has its own event loop and its own `ControllerClient`
(`ControllerClient.twin()`), so a heartbeat costs the broker's loop nothing and goes out on
time while the loop is merely busy.

A *wedged* loop must still lose its lease (a broker that cannot serve must not keep its
leaderships): before each heartbeat the thread checks that the broker's loop ran a callback it
scheduled (`call_soon_threadsafe`) less than `heartbeat_loop_stall_max_ms` after scheduling
it (whatever the heartbeat interval); while one waits longer, no
heartbeat goes out, and the controller fences the broker one session timeout later (a stopped
process's threads stop too; a cut-off host's heartbeats do not arrive).

Invariants: the thread only reads the lifecycle's state and sets `last_heartbeat_ok` (a float,
the isolation rule's clock, at once); everything else an answer changes is applied on the
broker's loop (`BrokerLifecycle.apply_heartbeat_answer`), which ignores answers about an older
registration. Registration, re-registration after STALE_BROKER_EPOCH, the early heartbeat and
controlled shutdown stay on the broker's loop.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import TYPE_CHECKING, Optional

from partitions.errors import ErrorCode, KraftlogError

if TYPE_CHECKING:
    from metadata_quorum.client import BrokerLifecycle

log = logging.getLogger(__name__)

HEARTBEAT_LOOP_STALL_MAX_MS = 5_000
HEARTBEAT_THREAD_JOIN_TIMEOUT_S = 5.0


class BrokerHeartbeatThread:
    """Sends `lifecycle`'s heartbeats every `lifecycle.heartbeat_interval_ms` from a daemon
    thread while the broker's loop (the one `start()` is called on) keeps turning (module
    docstring). `heartbeats_sent` / `heartbeats_skipped` count for tests and logs."""

    def __init__(self, lifecycle: "BrokerLifecycle", *,
                 loop_stall_max_ms: int = HEARTBEAT_LOOP_STALL_MAX_MS) -> None:
        self.lifecycle = lifecycle
        self.loop_stall_max_ms = loop_stall_max_ms
        self.heartbeats_sent = 0
        self.heartbeats_skipped = 0
        self._broker_loop: Optional[asyncio.AbstractEventLoop] = None
        self._loop_seen = time.monotonic()   # the broker's loop last ran our callback then
        self._ping_sent = self._loop_seen     # our last callback was scheduled then
        self._thread: Optional[threading.Thread] = None
        self._own_loop: Optional[asyncio.AbstractEventLoop] = None
        self._task: Optional[asyncio.Task] = None
        self._stopping = threading.Event()

    # -- broker loop side ------------------------------------------------------------------
    def start(self) -> None:
        """Start the thread; call on the broker's event loop."""
        self._broker_loop = asyncio.get_running_loop()
        self._loop_seen = self._ping_sent = time.monotonic()
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="broker-heartbeat", daemon=True)
        self._thread.start()
        ready.wait(HEARTBEAT_THREAD_JOIN_TIMEOUT_S)

    def stop(self) -> None:
        """Stop sending (a heartbeat in flight is cancelled) and wait for the thread."""
        self._stopping.set()
        loop, task = self._own_loop, self._task
        if loop is not None and task is not None:
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:   # its loop already closed
                pass
        if self._thread is not None:
            self._thread.join(HEARTBEAT_THREAD_JOIN_TIMEOUT_S)
            if self._thread.is_alive():
                log.warning("broker heartbeat thread did not stop within %.0f s", HEARTBEAT_THREAD_JOIN_TIMEOUT_S)
            self._thread = None

    def _mark_loop_seen(self) -> None:
        self._loop_seen = time.monotonic()

    def loop_silence_ms(self) -> float:
        """How long our last callback has waited for the broker's loop (ms; 0 once it ran):
        independent of the heartbeat interval, which may be longer than the limit."""
        sent = self._ping_sent
        if self._loop_seen >= sent:
            return 0.0
        return (time.monotonic() - sent) * 1000

    # -- heartbeat thread side -------------------------------------------------------------
    def _run(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        self._own_loop = loop
        try:
            self._task = loop.create_task(self._main())
            ready.set()
            loop.run_until_complete(self._task)
        except asyncio.CancelledError:
            pass
        except Exception:   # noqa: BLE001 - a broken thread must say so; the lease then expires
            log.exception("broker heartbeat thread failed")
        finally:
            ready.set()
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    def _ping_broker_loop(self) -> bool:
        """Schedule the next callback unless the last one still waits (its age is the stall)."""
        if self._loop_seen < self._ping_sent:
            return True
        self._ping_sent = time.monotonic()
        try:
            self._broker_loop.call_soon_threadsafe(self._mark_loop_seen)
            return True
        except RuntimeError:   # the broker's loop is closed: stop
            return False

    async def _main(self) -> None:
        lc = self.lifecycle
        client = lc.client.twin()
        skipped_since: Optional[float] = None
        try:
            while not self._stopping.is_set():
                if not self._ping_broker_loop():
                    return
                await asyncio.sleep((lc.heartbeat_interval_ms or 2000) / 1000)
                if self._stopping.is_set():
                    return
                if lc._paused or lc.broker_epoch is None:
                    continue
                silence_ms = self.loop_silence_ms()
                if silence_ms > self.loop_stall_max_ms:
                    self.heartbeats_skipped += 1
                    if skipped_since is None:
                        skipped_since = time.monotonic()
                        log.warning("broker heartbeats held: the event loop has not turned for %.0f ms (more than "
                                    "heartbeat_loop_stall_max_ms=%d); the controller fences this broker if it "
                                    "stays wedged", silence_ms, self.loop_stall_max_ms)
                    continue
                if skipped_since is not None:
                    log.warning("broker heartbeats resumed: the event loop turns again (held %.0f ms)",
                                (time.monotonic() - skipped_since) * 1000)
                    skipped_since = None
                await self._heartbeat(client)
        finally:
            await client.close()

    async def _heartbeat(self, client) -> None:
        lc = self.lifecycle
        epoch = lc.broker_epoch
        try:
            body = await client.heartbeat(lc.broker_id, epoch, lc._metadata_offset(),
                                          want_shutdown=lc.in_controlled_shutdown,
                                          log_reports=lc.pending_log_reports or None,
                                          timeout_ms=lc.session_timeout_ms)
        except asyncio.CancelledError:
            raise
        except KraftlogError as exc:
            if exc.code is ErrorCode.STALE_BROKER_EPOCH:   # registration lost: the loop registers again
                self._broker_loop.call_soon_threadsafe(lc.reregister_soon, epoch)
            else:
                log.info("heartbeat failed: %s", exc)
            return
        except Exception as exc:   # noqa: BLE001 - the next interval tries again
            log.info("heartbeat failed: %s", exc)
            return
        answered_at = time.monotonic()
        self.heartbeats_sent += 1
        if body.get("broker_epoch") == lc.broker_epoch:
            lc.last_heartbeat_ok = answered_at   # the isolation rule's clock, at once
        if client.active_url != lc._heartbeat_controller:
            lc._heartbeat_controller = client.active_url
            log.info("heartbeat answered by the active controller %s", client.active_url)
        try:
            self._broker_loop.call_soon_threadsafe(lc.apply_heartbeat_answer, body, answered_at)
        except RuntimeError:   # the broker's loop closed meanwhile
            pass
