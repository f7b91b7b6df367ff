"""The ReplicatedLog contract: an ordered, replicated sequence of opaque plain-data entries.

Nothing here knows about Kafka. A `StateMachine` consumes committed entries in the same
order on every node; a `ReplicatedLog` accepts proposals on the leader. Proposals can end
in three ways: applied (the state machine's result is returned), not applied (NotLeaderError:
this node refused before anything was appended), or unknown (OutcomeUnknownError: leader
change, timeout...). Callers must make proposals idempotent because of the third case.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Protocol, runtime_checkable


class ProposalError(Exception):
    """Base of proposal failures. `outcome_known` is True only when the entries were
    certainly not applied; otherwise the proposal may still commit later."""

    outcome_known = False

    def __init__(self, reason: str, leader_id: Optional[int] = None):
        super().__init__(reason)
        self.reason = reason
        self.leader_id = leader_id


class NotLeaderError(ProposalError):
    """This node is not the raft leader (or there is none); nothing was appended.
    Retry on the node `leader_id` (None while an election is in progress)."""

    outcome_known = True


class OutcomeUnknownError(ProposalError):
    """The proposal may or may not have been committed (leader changed, lost response,
    timeout). Retry with the same idempotency key, or read the state to find out."""


class StateMachine(Protocol):
    """Consumes committed entries. All three methods run on the raft thread and must be
    deterministic; `apply` must never raise (an exception would be retried forever)."""

    def apply(self, entries: list) -> Any: ...

    def snapshot(self) -> Any: ...

    def restore(self, data: Any) -> None: ...


@runtime_checkable
class ReplicatedLog(Protocol):
    """The leader-side handle of a replicated log, used from one asyncio event loop."""

    @property
    def is_leader(self) -> bool: ...

    @property
    def leader_id(self) -> Optional[int]: ...

    @property
    def term(self) -> int: ...

    @property
    def ready(self) -> bool: ...

    async def propose(self, entries: list, timeout_s: Optional[float] = None) -> Any: ...

    def add_listener(self, callback: Callable[[], None]) -> None:
        """`callback()` is called on the event loop whenever leadership, leader or term
        may have changed, and after entries were applied."""
        ...
