"""Transaction verification on a partition leader (Kafka KIP-890 part 1), the pure part.

Before a leader appends the first transactional batch of a producer's new transaction on
a partition, it asks the transaction coordinator whether the partition is in that
producer's ongoing transaction (Kafka: AddPartitionsToTxn with verifyOnly; here
`TransactionCoordinatorState.verify_partitions`). Without it, a batch written to a
partition that was never added to the transaction would open a transaction there that no
marker ever ends (a hanging transaction: the LSO is stuck).

`VerificationCache` decides when a round trip is needed and remembers the answers:

- no verification when the partition already has an open transaction of the producer at
  that epoch (its first batch was verified; the marker will end it), nor when the partition
  knows a newer epoch of the producer (the log refuses the batch as fenced), nor when
  (producer id, epoch) was verified on this partition since the producer's last marker
  there, under the same leader epoch (later batches of the same transaction cost nothing);
- a `VerificationGuard` is taken *before* the request and checked right before the append
  (with no await between the check and the append): a marker of that producer applied in
  between (the transaction ended, e.g. aborted on timeout), a rebuilt transaction index or
  a new leader epoch make the verification stale, and the batch is verified again
  (Kafka's VerificationGuard).

Invariants: an entry is only trusted while its transaction index object, the producer's
marker token there and the partition's leader epoch are the ones it was verified under;
at most `max_entries_per_partition` producers are remembered per partition (the oldest go
first; a forgotten one is simply verified again). Pure: no IO, no asyncio.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

DEFAULT_MAX_ENTRIES_PER_PARTITION = 1_000


@dataclass(frozen=True)
class VerificationGuard:
    """What a verification of `producer_id` on one partition was made under."""

    producer_id: int
    producer_epoch: int
    index: object          # the partition log's TransactionIndex object (replaced on rebuild)
    marker_token: int      # index.marker_token(producer_id) when the verification started
    leader_epoch: int

    def holds(self, index, leader_epoch: int) -> bool:
        """True while no marker of the producer, no index rebuild and no leader change
        happened since the guard was taken."""
        return (index is self.index and leader_epoch == self.leader_epoch
                and index.marker_token(self.producer_id) == self.marker_token)


def transactional_producer(headers: Iterable) -> tuple[int, int] | None:
    """(producer id, epoch) of the transactional data batches among `headers`
    (BatchHeader objects), None if there are none; ValueError if they name several
    producers (a produce request carries one producer's batches)."""
    found = {(h.producer_id, h.producer_epoch) for h in headers if h.is_transactional and not h.is_control}
    if not found:
        return None
    if len(found) > 1:
        raise ValueError(f"transactional batches of several producers in one request: {sorted(found)}; "
                         "send one producer's batches per request")
    return found.pop()


class VerificationCache:
    """Verified (producer id, epoch) per partition of one leader (see module docstring)."""

    def __init__(self, max_entries_per_partition: int = DEFAULT_MAX_ENTRIES_PER_PARTITION) -> None:
        self.max_entries_per_partition = max(1, max_entries_per_partition)
        self._verified: dict[tuple[str, int], dict[int, VerificationGuard]] = {}
        self.verifications = 0   # round trips asked for (tests, metrics)

    def needs_verification(self, tp: tuple[str, int], index, producer_id: int, producer_epoch: int,
                           leader_epoch: int) -> bool:
        if index is not None and producer_id in index.ongoing and index.epochs.get(producer_id) == producer_epoch:
            return False
        if index is not None and index.epochs.get(producer_id, -1) > producer_epoch:
            return False   # a fenced epoch: the log refuses the batch itself (INVALID_PRODUCER_EPOCH)
        entries = self._verified.get(tp)
        g = entries.get(producer_id) if entries else None
        if g is not None:
            if g.producer_epoch == producer_epoch and g.holds(index, leader_epoch):
                return False
            del entries[producer_id]
        return True

    def guard(self, index, producer_id: int, producer_epoch: int, leader_epoch: int) -> VerificationGuard:
        """Taken before asking the coordinator."""
        self.verifications += 1
        return VerificationGuard(producer_id, producer_epoch, index, index.marker_token(producer_id), leader_epoch)

    def remember(self, tp: tuple[str, int], guard: VerificationGuard) -> None:
        """The coordinator confirmed `guard`'s producer on `tp` and the guard still holds."""
        entries = self._verified.setdefault(tp, {})
        entries.pop(guard.producer_id, None)
        entries[guard.producer_id] = guard
        while len(entries) > self.max_entries_per_partition:
            del entries[next(iter(entries))]

    def forget_partition(self, tp: tuple[str, int]) -> None:
        self._verified.pop(tp, None)


__all__ = ["VerificationCache", "VerificationGuard", "transactional_producer", "DEFAULT_MAX_ENTRIES_PER_PARTITION"]
