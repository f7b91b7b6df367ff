"""Replicated log abstraction (no Kafka concepts): protocol, pysyncobj adapter, in-memory fake."""
from raft.log import NotLeaderError, OutcomeUnknownError, ProposalError, ReplicatedLog, StateMachine
from raft.memory import InMemoryReplicatedLog

__all__ = [
    "NotLeaderError",
    "OutcomeUnknownError",
    "ProposalError",
    "ReplicatedLog",
    "StateMachine",
    "InMemoryReplicatedLog",
]
