"""Transaction verification on a partition leader (Kafka KIP-890 part 1), the asyncio shell.

A transactional batch is appended only if its partition is in its producer's ongoing
transaction: before the first transactional batch of a producer's new transaction on a
partition, the leader asks the transaction coordinator (local state, or
`POST /internal/v1/transactions/{txid}/verify` on the coordinator, Kafka's
AddPartitionsToTxn verifyOnly). The cache and guard rules are in
partitions/transactions/verification.py. Refusals: INVALID_TXN_STATE (not in the
transaction), PRODUCER_FENCED / INVALID_PRODUCER_ID_MAPPING; the coordinator being
unavailable, moving or completing the transaction is retriable (the Kafka listener answers
those NOT_ENOUGH_REPLICAS, as Kafka 3.6+ does, so old clients retry; PRODUCER_FENCED is
INVALID_PRODUCER_EPOCH there, Produce's fencing error, which clients treat as fatal).

Hooks (a few lines each): the HTTP partition route for raw batches
(http_api/broker/produce.py: the transactional id comes in `X-Kraftlog-Transactional-Id`,
which the coordinator's records route sets on what it forwards, see `forward_headers`) and
the Kafka listener's Produce (the request's transactional id). The check that the guard
still holds is the last step of `verify` and the caller appends right after it, with no
await in between, so no marker can slip in.

This module imports neither produce.py nor transactions.py (both use it).
"""
from __future__ import annotations

import contextvars
import logging

from aiohttp import web

from partitions.errors import ErrorCode, KraftlogError
from partitions.transactions.verification import VerificationCache, transactional_producer

log = logging.getLogger("kraftlog.transactions")

TRANSACTIONAL_ID_HEADER = "X-Kraftlog-Transactional-Id"
VERIFIER_KEY: web.AppKey = web.AppKey("transaction_verifier", object)
MAX_GUARD_ATTEMPTS = 3   # verifications of one batch when markers keep slipping in between
# the transactional id of the records the coordinator's records route forwards (set around it)
FORWARDING_TRANSACTIONAL_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "kraftlog_forwarding_transactional_id", default=None)
# Kafka 3.6+: verification errors older producers would not retry become NOT_ENOUGH_REPLICAS
_KAFKA_RETRIABLE = frozenset({ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                              ErrorCode.NOT_COORDINATOR, ErrorCode.CONCURRENT_TRANSACTIONS})


def forward_headers() -> dict[str, str]:
    """The header naming the transactional id of records forwarded to a leader (empty
    outside the coordinator's records route)."""
    txid = FORWARDING_TRANSACTIONAL_ID.get()
    return {TRANSACTIONAL_ID_HEADER: txid} if txid else {}


class TransactionVerifier:
    """Leader-side verification of transactional appends (see module docstring).
    `coordinator` is the broker's http_api.broker.transactions.TransactionCoordinator."""

    def __init__(self, coordinator) -> None:
        self.coordinator = coordinator
        self.rm = coordinator.rm
        self.cache = VerificationCache()
        self.refused = 0

    async def verify(self, transactional_id: str | None, topic: str, partition: int, headers, *,
                     kafka: bool = False) -> None:
        """Return when the transactional batches among `headers` (BatchHeader objects) may
        be appended to `topic`-`partition` (led here) now; raise otherwise. The caller
        appends right after, without awaiting anything else first."""
        try:
            producer = transactional_producer(headers)
        except ValueError as e:
            raise KraftlogError(ErrorCode.INVALID_RECORD, str(e)) from None
        if producer is None:
            return
        if not transactional_id:
            raise KraftlogError(ErrorCode.INVALID_RECORD,
                                f"transactional batches need their transactional id ({TRANSACTIONAL_ID_HEADER} "
                                "header); write transactions through POST /v1/transactions/{txid}/records")
        pid, epoch = producer
        tp = (topic, partition)
        try:
            for _ in range(MAX_GUARD_ATTEMPTS):
                part, lg = self.rm.leader_partition(topic, partition)
                index = getattr(lg, "transactions", None)
                if index is None or not self.cache.needs_verification(tp, index, pid, epoch, part.leader_epoch):
                    return
                guard = self.cache.guard(index, pid, epoch, part.leader_epoch)
                await self._ask(transactional_id, pid, epoch, tp)
                part, lg = self.rm.leader_partition(topic, partition)
                if guard.holds(getattr(lg, "transactions", None), part.leader_epoch):
                    self.cache.remember(tp, guard)
                    return   # no await from here to the caller's append
            raise KraftlogError(ErrorCode.CONCURRENT_TRANSACTIONS,
                                f"{topic}-{partition}: the transaction of {transactional_id!r} kept ending while "
                                "its write was being verified; retry")
        except KraftlogError as e:
            if e.code in (ErrorCode.INVALID_TXN_STATE, ErrorCode.PRODUCER_FENCED,
                          ErrorCode.INVALID_PRODUCER_ID_MAPPING):
                self.refused += 1
            if kafka and e.code in _KAFKA_RETRIABLE:
                raise KraftlogError(ErrorCode.NOT_ENOUGH_REPLICAS,
                                    f"transaction verification: {e.code.name}: {e.message}") from None
            if kafka and e.code is ErrorCode.PRODUCER_FENCED:   # as Kafka: Produce answers a fenced epoch so
                raise KraftlogError(ErrorCode.INVALID_PRODUCER_EPOCH, e.message) from None
            raise

    async def _ask(self, txid: str, pid: int, epoch: int, tp: tuple[str, int]) -> None:
        """The coordinator's answer for `tp`: returns if it is in the ongoing transaction."""
        co = self.coordinator
        p, leader, url = await co.coordinator_of(txid)
        if leader == co.config.broker_id:
            errors = await co.verify_local(txid, pid, epoch, [tp])
        else:
            errors = await self._ask_remote(url, txid, pid, epoch, tp)
        err = errors.get(tp, ErrorCode.INVALID_TXN_STATE)
        if err is not None:
            raise KraftlogError(err, f"{tp[0]}-{tp[1]} is not in the ongoing transaction of {txid!r} (producer "
                                     f"{pid} epoch {epoch}): add the partition to the transaction "
                                     "(AddPartitionsToTxn) before writing to it")

    async def _ask_remote(self, url: str | None, txid: str, pid: int, epoch: int,
                          tp: tuple[str, int]) -> dict[tuple[str, int], ErrorCode | None]:
        body = {"producer_id": pid, "producer_epoch": epoch, "partitions": [{"topic": tp[0], "partition": tp[1]}]}
        doc = await self.coordinator.post_to_coordinator(txid, url, f"/internal/v1/transactions/{txid}/verify", body,
                                                         forwarded=False,
                                                         status_error=ErrorCode.COORDINATOR_NOT_AVAILABLE)
        out: dict[tuple[str, int], ErrorCode | None] = {}
        for r in doc.get("results", []):
            code = r.get("error_code")
            out[(r["topic"], int(r["partition"]))] = ErrorCode[code] if code else None
        return out


async def verify_http_produce(request: web.Request, topic: str, partition: int, headers) -> None:
    """The HTTP partition route's hook: verify raw transactional batches (no-op for others)."""
    verifier = request.app.get(VERIFIER_KEY)
    if verifier is None:
        if any(h.is_transactional and not h.is_control for h in headers):
            raise KraftlogError(ErrorCode.INVALID_RECORD, "this broker has no transaction coordinator: "
                                                          "transactional batches are refused")
        return
    await verifier.verify(request.headers.get(TRANSACTIONAL_ID_HEADER), topic, partition, headers)


__all__ = ["TransactionVerifier", "verify_http_produce", "forward_headers", "FORWARDING_TRANSACTIONAL_ID",
           "TRANSACTIONAL_ID_HEADER", "VERIFIER_KEY"]


async def verify_kafka_produce(coordinator, transactional_id: str | None, topic: str, partition: int,
                               stored_batches: list) -> None:
    """The Kafka listener's Produce hook: `stored_batches` are the converted batches."""
    from partitions.log.record_batch import BatchHeader
    await coordinator.verifier.verify(transactional_id, topic, partition,
                                      [BatchHeader.parse(b) for b in stored_batches], kafka=True)
