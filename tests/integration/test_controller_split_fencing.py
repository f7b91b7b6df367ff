"""A split fencing through the controller's shell (issue 25): when a broker's session expires,
the controller's first entry fences it with only the leader changes of the partitions it led,
and its maintenance loop writes the ISR removals in the next entries, until the broker is in
no ISR. In-process controller over the in-memory raft log, a real HTTP client, a clock the
test moves (`fence_isr_removals_inline_max=0` splits a 60-partition fencing; the default
splits from 1,000 ISR-only removals)."""
from __future__ import annotations

from metadata_quorum.controller import ControllerSettings
from metadata_quorum.records import FenceBrokerRecord, PartitionChangeRecord, entry_records
from metadata_quorum.state_machine import MetadataStateMachine
from tests.rigs.controller_inprocess import inprocess_controller, wait_until

SESSION_MS = 9000
PARTITIONS = 60


class RecordingStateMachine(MetadataStateMachine):
    """Keeps the records of every applied entry (one list per entry)."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.entries: list = []

    def _apply_entry(self, entry: dict) -> dict:
        result = super()._apply_entry(entry)
        if result.get("ok") and not result.get("duplicate") and "records" in entry:
            self.entries.append(entry_records(entry["records"]))
        return result


async def test_an_expired_broker_is_fenced_with_its_leader_changes_first_then_its_isr_removals():
    sm = RecordingStateMachine("c-split")
    settings = ControllerSettings(broker_session_timeout_ms=SESSION_MS, fence_isr_removals_inline_max=0)
    async with inprocess_controller(sm, "c-split", settings) as ctl:
        c, clock, epochs = ctl.client, ctl.clock, ctl.epochs
        await c.create_topic("orders", PARTITIONS, 3)
        with sm.lock:
            parts = dict(sm.image.topics["orders"].partitions)
        victim = 2
        led = {p for p, reg in parts.items() if reg.leader == victim}
        assert 0 < len(led) < PARTITIONS and all(victim in reg.isr for reg in parts.values())

        # broker 2 stops heartbeating; 1 and 3 go on (renewed before 2's lease runs out, so
        # the maintenance loop never sees theirs expired)
        clock.advance(SESSION_MS - 1000)
        for b in (1, 3):
            await c.heartbeat(b, epochs[b], 10**9)
        clock.advance(2000)

        def isr_clean() -> bool:
            with sm.lock:
                return all(victim not in reg.isr for reg in sm.image.topics["orders"].partitions.values())
        await wait_until(isr_clean)
        fencing = [i for i, e in enumerate(sm.entries)
                   if any(isinstance(r, FenceBrokerRecord) and r.broker_id == victim for r in e)]
        assert len(fencing) == 1
        first = sm.entries[fencing[0]]
        assert {r.partition for r in first if isinstance(r, PartitionChangeRecord)} == led
        rest = [r for e in sm.entries[fencing[0] + 1:] for r in e if isinstance(r, PartitionChangeRecord)]
        assert {r.partition for r in rest} == set(parts) - led       # the ISR removals, later
        with sm.lock:
            after = sm.image.topics["orders"].partitions
            assert sm.image.brokers[victim].fenced
            assert all(after[p].leader not in (victim, -1) for p in led)
            assert all(after[p].leader == parts[p].leader for p in set(parts) - led)
