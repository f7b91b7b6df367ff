"""Transaction coordinator state of one `__transaction_state` partition (pure).

A transactional id lives in partition crc32(id) % partition count of the internal,
compacted `__transaction_state` topic; that partition's leader is its coordinator. Per id,
`TxnMetadata`: producer id, epoch, timeout, state, the partitions (and group offsets) of the
open transaction. States (Kafka's TransactionState):

    Empty -> Ongoing -> PrepareCommit -> CompleteCommit -> Ongoing ...
                     -> PrepareAbort  -> CompleteAbort  -> Ongoing ...

Protocol (the IO shell follows it; nothing here does IO):
- every method that changes an id returns the new `TxnMetadata` without applying it; the
  shell writes `record(new)` to the partition (acks=all) and only then calls `apply(new)`:
  the log is ahead of the cache, so a new coordinator replaying the log (`replay`) resumes a
  PrepareCommit/PrepareAbort by writing the markers again (markers are idempotent at the
  partitions: a marker with nothing open is ignored) and completing it;
- `init` bumps the epoch (fencing the previous producer: `PRODUCER_FENCED`); an Ongoing
  transaction is first aborted under the bumped epoch (prepare_abort, markers, complete);
- `add_partitions` / `add_offsets` open the transaction (Ongoing) with its first write;
- `end` moves Ongoing to PrepareCommit/PrepareAbort; the shell writes the markers to every
  partition of the transaction and then `complete` (CompleteCommit/CompleteAbort);
- `expired` lists Ongoing transactions past their timeout: the shell aborts them with a
  bumped epoch (the late producer is fenced).

Invariants: epochs of an id only grow; a transaction's partitions are only added while
Ongoing; Prepare* is left only by `complete`.
"""
from __future__ import annotations

import enum
import json
import zlib
from dataclasses import dataclass, field, replace
from typing import Any

from partitions.errors import ErrorCode, KraftlogError
from partitions.internal_topics import TRANSACTION_STATE_TOPIC

RECORD_VERSION = 1
MAX_EPOCH = 32767


class TxnState(enum.Enum):
    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"

    @property
    def preparing(self) -> bool:
        return self in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)


@dataclass(frozen=True)
class TxnMetadata:
    """One transactional id. `partitions`: sorted (topic, partition) of the open transaction;
    `offsets`: {group: {(topic, partition): offset}} sent to it (committed with it)."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState = TxnState.EMPTY
    partitions: tuple[tuple[str, int], ...] = ()
    offsets: tuple[tuple[str, str, int, int], ...] = ()   # (group, topic, partition, offset)
    start_ms: int = -1
    update_ms: int = -1

    @property
    def committing(self) -> bool:
        return self.state is TxnState.PREPARE_COMMIT


def partition_for(transactional_id: str, num_partitions: int) -> int:
    assert num_partitions > 0, "__transaction_state needs at least one partition"
    return zlib.crc32(transactional_id.encode()) % num_partitions


def _canonical(doc: Any) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def record_key(transactional_id: str) -> bytes:
    return _canonical({"v": RECORD_VERSION, "type": "txn", "id": transactional_id})


def record(md: TxnMetadata) -> tuple[bytes, bytes]:
    """(key, value) of `md` in `__transaction_state` (compaction keeps the latest per id)."""
    return record_key(md.transactional_id), _canonical({
        "v": RECORD_VERSION, "producer_id": md.producer_id, "producer_epoch": md.producer_epoch,
        "timeout_ms": md.timeout_ms, "state": md.state.value, "partitions": [list(tp) for tp in md.partitions],
        "offsets": [list(o) for o in md.offsets], "start_ms": md.start_ms, "update_ms": md.update_ms})


def decode(key: bytes | None, value: bytes | None) -> tuple[str, TxnMetadata | None] | None:
    """(id, metadata or None for a tombstone) of a `__transaction_state` record; None if the
    record is not a transaction record."""
    try:
        k = json.loads(key) if key else None
        if not isinstance(k, dict) or k.get("type") != "txn":
            return None
        tid = str(k["id"])
        if value is None:
            return tid, None
        v = json.loads(value)
        return tid, TxnMetadata(
            tid, int(v["producer_id"]), int(v["producer_epoch"]), int(v["timeout_ms"]), TxnState(v["state"]),
            tuple((str(t), int(p)) for t, p in v["partitions"]),
            tuple((str(g), str(t), int(p), int(o)) for g, t, p, o in v["offsets"]),
            int(v["start_ms"]), int(v["update_ms"]))
    except (ValueError, KeyError, TypeError):
        return None


class TransactionCoordinatorState:
    """The transactional ids of one `__transaction_state` partition (see module docstring)."""

    def __init__(self, max_timeout_ms: int) -> None:
        self.max_timeout_ms = max_timeout_ms
        self.txns: dict[str, TxnMetadata] = {}

    # ------------------------------------------------------------------ load / apply

    def replay(self, key: bytes | None, value: bytes | None) -> None:
        decoded = decode(key, value)
        if decoded is None:
            return
        tid, md = decoded
        if md is None:
            self.txns.pop(tid, None)
        else:
            self.txns[tid] = md

    def apply(self, md: TxnMetadata) -> None:
        """`md` is written: it becomes the current metadata of its id."""
        self.txns[md.transactional_id] = md

    def pending_completions(self) -> list[TxnMetadata]:
        """Transactions in PrepareCommit/PrepareAbort: markers to (re)write, then complete."""
        return [md for md in self.txns.values() if md.state.preparing]

    # ------------------------------------------------------------------ checks

    def check_timeout(self, timeout_ms: int) -> None:
        if not 0 < timeout_ms <= self.max_timeout_ms:
            raise KraftlogError(ErrorCode.INVALID_TRANSACTION_TIMEOUT,
                                f"transaction_timeout_ms={timeout_ms} must be in [1, {self.max_timeout_ms}] "
                                f"(the broker's transaction_max_timeout_ms); ask for a shorter timeout")

    def current(self, transactional_id: str, producer_id: int, producer_epoch: int) -> TxnMetadata:
        """The id's metadata if (producer_id, producer_epoch) is its current producer;
        PRODUCER_FENCED for an older epoch, INVALID_PRODUCER_ID_MAPPING otherwise."""
        md = self.txns.get(transactional_id)
        if md is None:
            raise KraftlogError(ErrorCode.INVALID_PRODUCER_ID_MAPPING,
                                f"transactional id {transactional_id!r} is not initialised; "
                                f"POST /v1/transactions/{transactional_id}/init first")
        if producer_id != md.producer_id or producer_epoch < md.producer_epoch:
            raise KraftlogError(ErrorCode.PRODUCER_FENCED,
                                f"producer {producer_id} epoch {producer_epoch} of transactional id "
                                f"{transactional_id!r} was fenced by producer {md.producer_id} epoch "
                                f"{md.producer_epoch} (a newer init, or a timed-out transaction); "
                                f"close this producer and initialise a new one")
        if producer_epoch > md.producer_epoch:
            raise KraftlogError(ErrorCode.INVALID_PRODUCER_ID_MAPPING,
                                f"producer epoch {producer_epoch} is newer than the coordinator's "
                                f"{md.producer_epoch} for {transactional_id!r}; initialise the id again")
        return md

    @staticmethod
    def _not_while_completing(md: TxnMetadata) -> None:
        if md.state.preparing:
            raise KraftlogError(ErrorCode.CONCURRENT_TRANSACTIONS,
                                f"transaction of {md.transactional_id!r} is completing ({md.state.value}); retry")

    def verify_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                          partitions: list[tuple[str, int]]) -> dict[tuple[str, int], ErrorCode | None]:
        """KIP-890 part 1 (AddPartitionsToTxn verifyOnly): per partition None if it is in the
        producer's ongoing transaction, else INVALID_TXN_STATE. Fencing and unknown ids
        raise (PRODUCER_FENCED, INVALID_PRODUCER_ID_MAPPING); a transaction completing
        raises CONCURRENT_TRANSACTIONS (its markers come next: the write is too late or early)."""
        md = self.current(transactional_id, producer_id, producer_epoch)
        self._not_while_completing(md)
        have = set(md.partitions) if md.state is TxnState.ONGOING else set()
        return {tp: (None if tp in have else ErrorCode.INVALID_TXN_STATE) for tp in partitions}

    # ------------------------------------------------------------------ transitions

    def init(self, transactional_id: str, timeout_ms: int, new_producer_id: int, now_ms: int) -> TxnMetadata:
        """The metadata after InitProducerId: a new id starts Empty at epoch 0 with
        `new_producer_id`; a known one gets epoch + 1. An Ongoing transaction is returned
        as PrepareAbort under the bumped epoch (the shell aborts it, then inits again);
        CONCURRENT_TRANSACTIONS while one is completing."""
        self.check_timeout(timeout_ms)
        md = self.txns.get(transactional_id)
        if md is None:
            return TxnMetadata(transactional_id, new_producer_id, 0, timeout_ms, TxnState.EMPTY,
                               update_ms=now_ms)
        self._not_while_completing(md)
        pid, epoch = md.producer_id, md.producer_epoch + 1
        if epoch > MAX_EPOCH:  # epoch exhausted: a fresh producer id (Kafka does the same)
            pid, epoch = new_producer_id, 0
        if md.state is TxnState.ONGOING:
            return replace(md, producer_epoch=epoch, producer_id=pid, state=TxnState.PREPARE_ABORT,
                           update_ms=now_ms)
        return replace(md, producer_id=pid, producer_epoch=epoch, timeout_ms=timeout_ms, state=TxnState.EMPTY,
                       partitions=(), offsets=(), start_ms=-1, update_ms=now_ms)

    def add_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                       partitions: list[tuple[str, int]], now_ms: int) -> TxnMetadata | None:
        """Partitions join the transaction (which begins with its first write); None when
        nothing changes (they already belong to the Ongoing transaction)."""
        md = self.current(transactional_id, producer_id, producer_epoch)
        self._not_while_completing(md)
        have = set(md.partitions) if md.state is TxnState.ONGOING else set()
        want = have | set(partitions)
        if md.state is TxnState.ONGOING and want == have:
            return None
        start = md.start_ms if md.state is TxnState.ONGOING else now_ms
        offsets = md.offsets if md.state is TxnState.ONGOING else ()
        return replace(md, state=TxnState.ONGOING, partitions=tuple(sorted(want)), offsets=offsets,
                       start_ms=start, update_ms=now_ms)

    def add_offsets(self, transactional_id: str, producer_id: int, producer_epoch: int, group: str,
                    offsets: list[tuple[str, int, int]], now_ms: int) -> TxnMetadata:
        """Group offsets sent to the transaction (sendOffsetsToTransaction): committed to
        the group when the transaction commits, dropped when it aborts."""
        md = self.current(transactional_id, producer_id, producer_epoch)
        self._not_while_completing(md)
        ongoing = md.state is TxnState.ONGOING
        kept = {(g, t, p): o for g, t, p, o in (md.offsets if ongoing else ())}
        for t, p, o in offsets:
            kept[(group, t, p)] = o
        return replace(md, state=TxnState.ONGOING, partitions=md.partitions if ongoing else (),
                       offsets=tuple(sorted((g, t, p, o) for (g, t, p), o in kept.items())),
                       start_ms=md.start_ms if ongoing else now_ms, update_ms=now_ms)

    def end(self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool,
            now_ms: int) -> TxnMetadata | None:
        """EndTxn: Ongoing -> PrepareCommit/PrepareAbort. None when there is nothing to do
        (no transaction open, or a retry of the same decision already completed); a retry
        while the same decision is completing returns the current metadata (the shell
        waits for it); the opposite decision is INVALID_TXN_STATE."""
        md = self.current(transactional_id, producer_id, producer_epoch)
        target = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
        done = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
        if md.state is TxnState.ONGOING:
            return replace(md, state=target, update_ms=now_ms)
        if md.state is target:
            return md
        if md.state in (done, TxnState.EMPTY):
            return None
        raise KraftlogError(ErrorCode.INVALID_TXN_STATE,
                            f"cannot {'commit' if commit else 'abort'} the transaction of {transactional_id!r}: "
                            f"it is {md.state.value}; begin a new transaction")

    @staticmethod
    def complete(md: TxnMetadata, now_ms: int) -> TxnMetadata:
        """PrepareCommit/PrepareAbort -> CompleteCommit/CompleteAbort once every marker is written."""
        assert md.state.preparing, md
        state = TxnState.COMPLETE_COMMIT if md.state is TxnState.PREPARE_COMMIT else TxnState.COMPLETE_ABORT
        return replace(md, state=state, partitions=(), offsets=(), start_ms=-1, update_ms=now_ms)

    def expired(self, now_ms: int) -> list[TxnMetadata]:
        """Ongoing transactions past their timeout, as PrepareAbort under a bumped epoch
        (the producer that let it run over is fenced, as Kafka does)."""
        out = []
        for md in self.txns.values():
            if md.state is TxnState.ONGOING and md.start_ms >= 0 and now_ms - md.start_ms > md.timeout_ms:
                if md.producer_epoch < MAX_EPOCH:
                    out.append(replace(md, producer_epoch=md.producer_epoch + 1, state=TxnState.PREPARE_ABORT,
                                       update_ms=now_ms))
                else:
                    out.append(replace(md, state=TxnState.PREPARE_ABORT, update_ms=now_ms))
        return out

    def next_expiry_ms(self) -> int | None:
        times = [md.start_ms + md.timeout_ms for md in self.txns.values()
                 if md.state is TxnState.ONGOING and md.start_ms >= 0]
        return min(times) if times else None


__all__ = ["TransactionCoordinatorState", "TxnMetadata", "TxnState", "partition_for", "record", "record_key",
           "decode", "TRANSACTION_STATE_TOPIC", "MAX_EPOCH"]
