"""InMemoryReplicatedLog: a deterministic single-process ReplicatedLog for tests.

Proposals are applied synchronously in proposal order (as a one-node quorum would).
Tests steer leadership with `become_leader()` / `lose_leadership()` and inject failures
with `fail_next(exc, apply=...)` to exercise the "outcome unknown" paths.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from raft.log import NotLeaderError, ProposalError, RaftPeerStats


class InMemoryReplicatedLog:
    def __init__(self, state_machine, node_id: int = 1, leader: bool = True):
        self.state_machine = state_machine
        self.node_id = node_id
        self._leader = leader
        self._term = 1 if leader else 0
        self._listeners: list[Callable[[], None]] = []
        self._failures: list[tuple[ProposalError, bool]] = []
        self.proposals = 0
        self._peer_stats = RaftPeerStats()   # no raft port: stays zero

    @property
    def is_leader(self) -> bool:
        return self._leader

    @property
    def leader_id(self) -> Optional[int]:
        return self.node_id if self._leader else None

    @property
    def term(self) -> int:
        return self._term

    @property
    def ready(self) -> bool:
        return True

    @property
    def peer_stats(self) -> RaftPeerStats:
        return self._peer_stats

    def add_listener(self, callback: Callable[[], None]) -> None:
        self._listeners.append(callback)

    def _notify(self) -> None:
        for cb in list(self._listeners):
            cb()

    def become_leader(self) -> None:
        self._term += 1
        self._leader = True
        self._notify()

    def lose_leadership(self) -> None:
        self._leader = False
        self._notify()

    def fail_next(self, exc: ProposalError, apply: bool = False) -> None:
        """Make the next proposal raise `exc`; with apply=True it is applied first (the
        'committed but the answer was lost' case)."""
        self._failures.append((exc, apply))

    async def propose(self, entries: list, timeout_s: Optional[float] = None) -> Any:
        if not self._leader:
            raise NotLeaderError("not the leader", leader_id=None)
        self.proposals += 1
        if self._failures:
            exc, apply = self._failures.pop(0)
            if apply:
                self.state_machine.apply(entries)
                self._notify()
            raise exc
        result = self.state_machine.apply(entries)
        self._notify()
        return result

    def snapshot_roundtrip(self) -> None:
        """Replace the state by a restore of its own snapshot (as after a restart)."""
        self.state_machine.restore(self.state_machine.snapshot())
