"""A broker's stall watchdog tells the controller its process is alive while its event loop is
busy (issue 25): `alive_note_sender` posts to the in-process controller's real
`POST /controller/v1/brokers/alive` route, which counts it as heard for the silence rule
(`QuorumController.note_alive`; the rule itself: tests/unit/metadata/
test_availability_silence_fencing.py). A busy broker used to be fenced when it left the
controller's probe unanswered."""
from __future__ import annotations

import asyncio

from http_api.broker.server import alive_note_sender
from metadata_quorum.controller import ControllerSettings
from metadata_quorum.state_machine import MetadataStateMachine
from tests.rigs.controller_inprocess import inprocess_controller


async def test_the_watchdog_note_reaches_the_controller_and_counts_as_heard():
    sm = MetadataStateMachine("c-alive")
    async with inprocess_controller(sm, "c-alive", ControllerSettings()) as ctl:
        server, clock, epochs = ctl.server, ctl.clock, ctl.epochs
        clock.advance(5000)   # no heartbeat for 5 s from anyone
        url = ctl.client.active_url
        assert server.controller._heartbeat_silence_ms(2, clock.monotonic_ms()) >= 5000
        await asyncio.to_thread(alive_note_sender(lambda: url, lambda: epochs[2], 2, {}), 800.0)
        assert server.controller._heartbeat_silence_ms(2, clock.monotonic_ms()) == 0
        # before registration (no epoch yet) nothing is sent; a stale epoch is answered, not counted
        await asyncio.to_thread(alive_note_sender(lambda: url, lambda: None, 3, {}), 800.0)
        await asyncio.to_thread(alive_note_sender(lambda: url, lambda: epochs[3] + 100, 3, {}), 800.0)
        assert server.controller._heartbeat_silence_ms(3, clock.monotonic_ms()) >= 5000


async def test_a_note_goes_to_the_next_controller_when_the_one_thought_active_does_not_take_it():
    """After the quorum changed leader while the broker's loop was too busy to follow, the
    URL it thinks active may be dead or no longer active: the note tries the others (a new
    active controller has heard from nobody and would count a reported broker as silent)."""
    import socket
    sm = MetadataStateMachine("c-alive-next")
    async with inprocess_controller(sm, "c-alive-next", ControllerSettings()) as ctl:
        server, clock, epochs = ctl.server, ctl.clock, ctl.epochs
        clock.advance(5000)
        url = ctl.client.active_url
        with socket.socket() as s:   # a port nothing listens on: a dead controller
            s.bind(("127.0.0.1", 0))
            dead = f"http://127.0.0.1:{s.getsockname()[1]}"
        send = alive_note_sender(lambda: dead, lambda: epochs[2], 2, {}, controller_urls=(dead, url))
        await asyncio.to_thread(send, 800.0)
        assert server.controller._heartbeat_silence_ms(2, clock.monotonic_ms()) == 0
        # only the dead one: the note fails (the watchdog logs it and tries again later)
        clock.advance(5000)
        only_dead = alive_note_sender(lambda: dead, lambda: epochs[2], 2, {}, controller_urls=(dead,))
        try:
            await asyncio.to_thread(only_dead, 800.0)
            raise AssertionError("a note no controller took must fail")
        except OSError:
            pass
        assert server.controller._heartbeat_silence_ms(2, clock.monotonic_ms()) >= 5000
