"""Transactional workload for the chaos harness (issue 18): atomic writes across partitions
of two topics, read back by read_committed consumers.

- `producers` transactional producers (the project's Python client,
  `Producer(transactional_id="chaos-txn-<i>")`) loop: begin a transaction, write 1-2 records
  to each of 2-4 partitions drawn from both topics (at least one of each), flush (the records
  route answers their offsets), then commit, or abort with `abort_probability`. Every value
  is unique. One `txn` op per transaction (history.py): `ok` with `committed` true/false once
  the commit/abort was answered; `fail` when it certainly never committed (the records write
  or the abort failed before any commit was sent); `info` when the commit's outcome is
  unknown. After any error the producer is closed and a new one initialises the same
  transactional id, which fences the old epoch and aborts what it left open.
- one read_committed consumer per partition (long polls, `isolation_level=read_committed`),
  fetch ops marked `txn` with the records, the high watermark and the last stable offset.
- `final_reads()`, once healed and every transactional id re-initialised (nothing left open):
  each partition read from 0 to its LSO once the LSO equals the high watermark.

The checker's transaction rules: `checker.check_transactions`.
"""
from __future__ import annotations

import asyncio
import json
import random
import time
from typing import Optional

from http_api.client.producer import Producer
from tests.chaos.harness.workload import read_partition_to

TXN_TOPICS = (("chaos-txn-a", 3), ("chaos-txn-b", 2))
TXN_TOPIC_CONFIGS = {"segment.bytes": "16384"}


class TxnWorkload:
    """Transactional producers and read_committed consumers next to a `Workload` (whose
    session, metadata and history it shares)."""

    def __init__(self, wl, topics=TXN_TOPICS, producers: int = 2, seed: int = 0, abort_probability: float = 0.3,
                 transaction_timeout_ms: int = 10_000, request_timeout_ms: int = 5_000,
                 delivery_timeout_ms: int = 15_000, op_interval_s: float = 0.05):
        self.wl = wl
        self.h = wl.h
        self.topics = tuple(topics)
        self.producers = producers
        self.rng = random.Random(seed * 7919 + 18)
        self.abort_probability = abort_probability
        self.transaction_timeout_ms = transaction_timeout_ms
        self.request_timeout_ms = request_timeout_ms
        self.delivery_timeout_ms = delivery_timeout_ms
        self.op_interval_s = op_interval_s
        self.positions = {tp: 0 for tp in self.topic_partitions()}
        self.stop_event = asyncio.Event()
        self.tasks: list[asyncio.Task] = []
        self.counts = {"committed": 0, "aborted": 0, "failed": 0, "unknown": 0}

    def topic_names(self) -> set:
        return {t for t, _ in self.topics}

    def topic_partitions(self) -> list[tuple[str, int]]:
        return [(t, p) for t, n in self.topics for p in range(n)]

    def txid(self, i: int) -> str:
        return f"chaos-txn-{i}"

    # ---- setup -------------------------------------------------------------------------

    async def create_topics(self, end: float) -> None:
        for t, n in self.topics:
            await self.wl._create(t, n, TXN_TOPIC_CONFIGS, end)

    def _producer(self, i: int) -> Producer:
        c = self.wl.c
        return Producer([c.direct_url(j) for j in c.ids], transactional_id=self.txid(i),
                        transaction_timeout_ms=self.transaction_timeout_ms,
                        request_timeout_ms=self.request_timeout_ms, delivery_timeout_ms=self.delivery_timeout_ms,
                        request_attempt_timeout_ms=min(2_000, self.request_timeout_ms), retry_backoff_ms=100)

    @staticmethod
    async def _close(producer: Optional[Producer]) -> None:
        if producer is None:
            return
        producer._txn_buffer, producer._in_transaction = [], False   # nothing more is sent
        try:
            await asyncio.wait_for(producer.close(), 5)
        except Exception:
            pass

    # ---- producers ---------------------------------------------------------------------

    def _pick(self) -> list[tuple[str, int]]:
        """2-4 partitions, at least one of each topic."""
        tps = [(t, self.rng.randrange(n)) for t, n in self.topics]
        others = [tp for tp in self.topic_partitions() if tp not in tps]
        tps += self.rng.sample(others, self.rng.randint(0, min(2, len(others))))
        return sorted(set(tps))

    async def producer(self, i: int) -> None:
        producer: Optional[Producer] = None
        n = 0
        while not self.stop_event.is_set():
            if producer is None:
                producer = self._producer(i)
                try:
                    await producer.init_transactions()
                except Exception:
                    await self._close(producer)
                    producer = None
                    await asyncio.sleep(0.5)
                    continue
            n += 1
            records = [[t, p, f"x{i}-{n}-{t[-1]}{p}-{j}"] for t, p in self._pick()
                       for j in range(self.rng.randint(1, 2))]
            intent = "abort" if self.rng.random() < self.abort_probability else "commit"
            op = self.h.invoke(f"txn-producer-{i}", "txn", txid=self.txid(i), records=records, intent=intent,
                               txn=True)
            stage, futures = "records", []
            try:
                producer.begin_transaction()
                for t, p, v in records:
                    futures.append(await producer.send(t, v, partition=p))
                await producer.flush()
                offsets = [[t, p, f.result().offset] for (t, p, _), f in zip(records, futures)]
                stage = "end"
                if intent == "commit":
                    await producer.commit_transaction()
                    self.h.ok(op, committed=True, offsets=offsets)
                    self.counts["committed"] += 1
                else:
                    await producer.abort_transaction()
                    self.h.ok(op, committed=False, offsets=offsets)
                    self.counts["aborted"] += 1
            except Exception as e:
                error = f"{stage}: {e.__class__.__name__}: {e}"[:200]
                for f in futures:   # the records' futures carry the same error
                    if f.done() and not f.cancelled():
                        f.exception()
                if stage == "records" or intent == "abort":   # no commit was ever sent
                    self.h.fail(op, error)
                    self.counts["failed"] += 1
                else:
                    self.h.info(op, error)
                    self.counts["unknown"] += 1
                await self._close(producer)
                producer = None   # the next one re-initialises the id: fences, aborts what is open
            await asyncio.sleep(self.op_interval_s)
        await self._close(producer)

    async def settle_transactional_ids(self, deadline_s: float = 60.0) -> None:
        """Initialise every transactional id once more: whatever a stopped producer left open
        is aborted, so the last stable offsets reach the high watermarks."""
        for i in range(self.producers):
            end = time.monotonic() + deadline_s
            while True:
                producer = self._producer(i)
                try:
                    await producer.init_transactions()
                    break
                except Exception as e:
                    if time.monotonic() > end:
                        raise RuntimeError(f"could not initialise {self.txid(i)} after the faults: {e}")
                    await asyncio.sleep(0.5)
                finally:
                    await self._close(producer)

    # ---- read_committed consumers ------------------------------------------------------

    async def fetch(self, topic: str, p: int, offset: int, final: bool = False, max_wait_ms: int = 300):
        wl = self.wl
        op = self.h.invoke("final-reader" if final else f"txn-consumer-{topic}-{p}", "fetch", topic=topic,
                           partition=p, offset=offset, final=final, txn=True, isolation_level="read_committed")
        url = (f"{wl.leader_url(p, topic)}/v1/topics/{topic}/partitions/{p}/records?offset={offset}"
               f"&max_wait_ms={max_wait_ms}&max_bytes=262144&isolation_level=read_committed")
        try:
            async with wl.session.get(url, headers={"Accept": "application/json"}) as r:
                body = await r.read()
                if r.status == 200:
                    doc = json.loads(body)
                    self.h.ok(op, records=[[x["offset"], x.get("value")] for x in doc["records"]],
                              high_watermark=doc["high_watermark"], next_offset=doc["next_offset"],
                              last_stable_offset=doc.get("last_stable_offset"))
                    return doc
                self.h.fail(op, wl._classify(r.status, body)[1])   # reads change nothing
        except Exception as e:
            self.h.fail(op, e.__class__.__name__[:200])
        await wl.refresh_metadata()
        return None

    async def consumer(self, topic: str, p: int) -> None:
        tp = (topic, p)
        while not self.stop_event.is_set():
            doc = await self.fetch(topic, p, self.positions[tp])
            if doc is not None:
                self.positions[tp] = max(self.positions[tp], doc["next_offset"])
            else:
                await asyncio.sleep(0.1)
            await asyncio.sleep(self.wl.op_interval_s)

    # ---- run ---------------------------------------------------------------------------

    def start(self) -> None:
        for i in range(self.producers):
            self.tasks.append(asyncio.create_task(self.producer(i)))
        for t, p in self.topic_partitions():
            self.tasks.append(asyncio.create_task(self.consumer(t, p)))

    async def stop(self) -> None:
        self.stop_event.set()
        if self.tasks:
            await asyncio.wait(self.tasks, timeout=30)
            for t in self.tasks:
                t.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)
            self.tasks = []

    async def final_reads(self, deadline_s: float = 90.0) -> dict:
        """Once healed and stopped: re-initialise the ids, then read each partition from 0 to
        its LSO once LSO == HW (read_committed, marked final). {"topic-partition": records}."""
        await self.settle_transactional_ids()
        out = {}
        end = time.monotonic() + deadline_s
        for topic, p in self.topic_partitions():
            while True:
                await self.wl.refresh_metadata()
                doc = await self.fetch(topic, p, 0, max_wait_ms=0)
                if doc and doc.get("last_stable_offset") == doc["high_watermark"]:
                    lso = doc["high_watermark"]
                    break
                if time.monotonic() > end:
                    raise RuntimeError(f"partition {topic}-{p}: the LSO never reached the HW for the final read "
                                       f"({doc and doc.get('last_stable_offset')} < {doc and doc['high_watermark']})")
                await asyncio.sleep(0.5)
            out[f"{topic}-{p}"] = await read_partition_to(
                lambda o, p=p, topic=topic: self.fetch(topic, p, o, final=True, max_wait_ms=0),
                f"{topic}-{p}", lso, end)
        return out

