"""Issue 25: the raft thread holds the state machine's lock for a whole apply (1-2 s for a
33,337-record fencing at 100,000 partitions). The controller's event loop must not block on
that lock: while it is held, a heartbeat waits (it reads the image), but the loop keeps
answering what needs no lock, and the heartbeat completes as soon as the lock is free. The
feed needs no image at all (the records of applied entries, under the feed's own lock): a
feed poll is answered during the apply. Before, the feed handler's blocking acquire stopped
the whole loop for the apply; then it waited for the apply (the survivors of a kill -9 at
100,000 partitions had the fencing 2 s after its commit, its pages behind the applies of the
follow-up entries)."""
from __future__ import annotations

import asyncio
import threading
import time

import aiohttp

from metadata_quorum.controller import ControllerSettings
from metadata_quorum.state_machine import MetadataStateMachine
from tests.rigs.controller_inprocess import inprocess_controller

HOLD_S = 1.5


async def test_the_loop_answers_while_the_raft_thread_holds_the_state_machine_lock():
    sm = MetadataStateMachine("c-loop-apply")
    async with inprocess_controller(sm, "c-loop-apply", ControllerSettings(), maintenance_interval_ms=5000) as ctl:
        url = ctl.client.controller_urls[0]
        held = threading.Event()
        release = threading.Event()

        def apply_in_progress() -> None:   # what the raft thread does during a long apply
            with sm.lock:
                held.set()
                release.wait(10)

        t = threading.Thread(target=apply_in_progress, name="fake-raft-apply")
        t.start()
        try:
            assert held.wait(5)
            async with aiohttp.ClientSession() as s:
                async def get(path: str) -> tuple:
                    async with s.get(url + path) as r:
                        return r.status, await r.json(), time.monotonic()

                started = time.monotonic()
                feed = asyncio.ensure_future(get("/controller/v1/metadata/records?after=0&max_wait_ms=0"))
                beat = asyncio.ensure_future(ctl.client.heartbeat(1, ctl.epochs[1], 10**9))
                await asyncio.sleep(0.2)
                # the loop is free: a route that needs no lock answers at once
                status, body, at = await get("/controller/v1/healthz")
                assert status == 200 and at - started < 0.8, at - started
                # the feed page was answered without the lock: the records applied before it
                assert feed.done()
                status, body, at = feed.result()
                assert status == 200 and body["records"], body
                assert body["metadata_offset"] == sm.feed_end == body["records"][-1]["offset"] + 1
                assert at - started < 0.8, at - started
                assert not beat.done()   # it reads the image: it waits for the lock
                await asyncio.sleep(HOLD_S - 0.2)
                release.set()
                state = await asyncio.wait_for(beat, 10)
                assert time.monotonic() - started >= HOLD_S - 0.05   # answered after the apply, not before
                assert state["broker_epoch"] == ctl.epochs[1] and not state["fenced"]
        finally:
            release.set()
            t.join(5)
