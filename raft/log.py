"""The ReplicatedLog contract: an ordered, replicated sequence of opaque plain-data entries.

Nothing here knows about Kafka. A `StateMachine` consumes committed entries in the same
order on every node; a `ReplicatedLog` accepts proposals on the leader. Proposals can end
in three ways: applied (the state machine's result is returned), not applied (NotLeaderError:
this node refused before anything was appended), or unknown (OutcomeUnknownError: leader
change, timeout...). Callers must make proposals idempotent because of the third case.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Protocol, runtime_checkable

log = logging.getLogger(__name__)

# largest raft frame a peer may announce (raft_frame_max_bytes); pysyncobj's own frames stay
# under ~64 KiB (entries and snapshots travel in appendEntriesBatchSizeBytes parts)
RAFT_FRAME_MAX_BYTES_DEFAULT = 16 * 1024 * 1024


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


@dataclass
class RaftPeerStats:
    """What a raft node's port refused from its peers (raft/frame_guard.py): frames over
    raft_frame_max_bytes and frames failing authentication. Incremented on the raft thread,
    read anywhere; `count` logs at most one line a second per kind."""

    frames_too_large: int = 0
    auth_failures: int = 0
    _last_log: dict = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self, kind: str, message: str, *args: Any) -> None:
        with self._lock:
            n = getattr(self, kind) + 1
            setattr(self, kind, n)
            now = time.monotonic()
            if now - self._last_log.get(kind, -1e9) < 1.0:
                return
            self._last_log[kind] = now
        log.warning(message + " (%d so far)", *args, n)

    def as_dict(self) -> dict:
        return {"raft_frames_too_large": self.frames_too_large, "raft_auth_failures": self.auth_failures}


class MembershipChangeError(ProposalError):
    """The leader refused a voter change before appending it: another change is not
    committed yet, the node is already (not) a voter, or it is the leader itself."""

    outcome_known = True


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

    @property
    def peer_stats(self) -> RaftPeerStats: ...

    async def propose(self, entries: list, timeout_s: Optional[float] = None) -> Any: ...

    def add_listener(self, callback: Callable[[], None]) -> None:
        """`callback()` is called on the event loop whenever leadership, leader or term
        may have changed, and after entries were applied."""
        ...
