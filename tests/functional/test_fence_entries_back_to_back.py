"""A split fencing's entries go out back to back (issue 25): when a fenced broker's changes
exceed `fence_batch_records_max`, the fencing entry holds the first batch of its leader
changes and the maintenance loop writes the rest (`QuorumController.fence_followups`). It
used to write one follow-up per `maintenance_interval_ms`; at 100,000 partitions that put
hundreds of milliseconds between the batches of leader changes the survivors wait for. Now
each committed write that leaves follow-ups kicks the loop at once. Driven through the
in-process controller's real routes with a maintenance interval of 5 s: the whole fencing
must land in far less than one interval."""
from __future__ import annotations

import asyncio
import time

from metadata_quorum.controller import ControllerSettings
from metadata_quorum.state_machine import MetadataStateMachine
from tests.rigs.controller_inprocess import inprocess_controller, wait_until


async def test_the_entries_of_a_split_fencing_are_written_back_to_back():
    sm = MetadataStateMachine("c-fence-b2b")
    settings = ControllerSettings(fence_batch_records_max=40, fence_isr_removals_inline_max=0)
    async with inprocess_controller(sm, "c-fence-b2b", settings, maintenance_interval_ms=5000) as ctl:
        await ctl.client.create_topic("t", 240, 3)
        img = sm.image
        led = sum(1 for p in img.topics["t"].partitions.values() if p.leader == 2)
        assert 40 < led < 240   # leader changes need more than one entry; ISR removals follow
        writes = ctl.server.writes
        t0 = time.monotonic()
        # broker 2's URL refuses connections: reported unreachable, probed, fenced
        answer = await ctl.client.report_unreachable(1, ctl.epochs[1], 2)
        assert answer["fenced"] is True

        def done() -> bool:
            parts = sm.image.topics["t"].partitions.values()
            return all(p.leader != 2 and 2 not in p.isr for p in parts)
        await wait_until(done, timeout_s=30)
        took = time.monotonic() - t0
        entries = ctl.server.writes - writes
        # 240 partition changes in entries of at most 40: 6 or more entries, all well within
        # one maintenance interval (5 s each: one per interval took 25 s or more)
        assert entries >= 6, entries
        assert took < 2.5, f"{entries} entries took {took:.2f} s"
        assert sm.image.brokers[2].fenced
        await wait_until(lambda: not ctl.server.controller.fence_pending, timeout_s=2.5)
