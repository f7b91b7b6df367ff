"""Client workloads against a ChaosCluster, recording every operation in a History.

- one producer per partition, acks=all, one record per request, unique values:
  plain JSON producers (never resend a value) and idempotent raw-batch producers (a
  producer id from POST /v1/producer-ids, a sequence per partition; after an unknown
  outcome they resend the same batch, same sequence, so a duplicate is a broker bug);
- one consumer per partition reading from the leader with long polls (fetch ops carry the
  records and the high watermark the broker reported);
- one group committer per partition committing the consumer's position and reading the
  committed offsets back;
- `final_reads()` once the faults are healed: every partition read from 0 to its HW.

Outcomes: 200 ok; a refusal the broker makes before storing anything
(NOT_LEADER_OR_FOLLOWER, NOT_ENOUGH_REPLICAS, UNKNOWN_TOPIC_OR_PARTITION) or a refused
connection is `fail`; anything else (timeouts, 5xx, resets) is `info`.
"""
from __future__ import annotations

import asyncio
import json
import random
import time
from typing import Optional

import aiohttp

from partitions.log.record_batch import Record, build_batch
from tests.chaos.harness.history import History

CERTAIN_FAILURES = {"NOT_LEADER_OR_FOLLOWER", "NOT_ENOUGH_REPLICAS", "UNKNOWN_TOPIC_OR_PARTITION",
                    "INVALID_REQUEST", "CORRUPT_MESSAGE"}
RAW_BATCH = "application/vnd.kraftlog.batch"


class Workload:
    """Producers, consumers and group committers for one topic."""

    def __init__(self, cluster, history: History, topic: str = "chaos", partitions: int = 3, seed: int = 0,
                 idempotent_every: int = 2, request_timeout_s: float = 8.0, op_interval_s: float = 0.02,
                 group: str = "chaos-group"):
        self.c = cluster
        self.h = history
        self.topic = topic
        self.partitions = partitions
        self.rng = random.Random(seed)
        self.idempotent = {p for p in range(partitions) if idempotent_every and p % idempotent_every == 1}
        self.timeout = aiohttp.ClientTimeout(total=request_timeout_s)
        self.op_interval_s = op_interval_s
        self.group = group
        self.leaders: dict[int, int] = {}
        self.positions: dict[int, int] = {p: 0 for p in range(partitions)}
        self.stop_event = asyncio.Event()
        self.session: Optional[aiohttp.ClientSession] = None
        self.tasks: list[asyncio.Task] = []

    # ---- plumbing ----------------------------------------------------------------------

    async def __aenter__(self):
        self.session = aiohttp.ClientSession(timeout=self.timeout,
                                             connector=aiohttp.TCPConnector(limit=64, force_close=False))
        return self

    async def __aexit__(self, *exc):
        await self.stop()
        await self.session.close()

    def _any_broker(self) -> str:
        ids = [i for i in self.c.ids if self.c.alive("broker", i)] or list(self.c.ids)
        return self.c.direct_url(self.rng.choice(ids))

    async def refresh_metadata(self) -> None:
        for _ in range(len(self.c.ids)):
            try:
                async with self.session.get(self._any_broker() + "/v1/metadata",
                                            timeout=aiohttp.ClientTimeout(total=2)) as r:
                    doc = await r.json()
                for t in doc.get("topics", []):
                    if t["name"] == self.topic:
                        for p in t["partitions"]:
                            self.leaders[p["partition"]] = p["leader"]
                return
            except Exception:
                continue

    def leader_url(self, p: int) -> str:
        leader = self.leaders.get(p, -1)
        return self.c.direct_url(leader) if leader in self.c.ids else self._any_broker()

    async def create_topic(self, deadline_s: float = 30.0) -> None:
        body = {"name": self.topic, "partitions": self.partitions, "replication_factor": len(self.c.ids),
                "configs": {"min.insync.replicas": str(min(2, len(self.c.ids)))}}
        end = time.monotonic() + deadline_s
        last = None
        while True:
            try:
                async with self.session.post(self._any_broker() + "/v1/topics", json=body) as r:
                    if r.status in (201, 409):
                        break
                    last = f"HTTP {r.status} {(await r.read())[:200]!r}"
            except Exception as e:
                last = repr(e)
            if time.monotonic() > end:
                raise RuntimeError(f"could not create the topic {self.topic!r}: {last}")
            await asyncio.sleep(0.3)
        while len(self.leaders) < self.partitions or any(v < 0 for v in self.leaders.values()):
            await self.refresh_metadata()
            await asyncio.sleep(0.2)

    @staticmethod
    def _classify(status: int, body: bytes) -> tuple[str, str]:
        try:
            doc = json.loads(body)
            code, message = doc.get("error_code", f"HTTP {status}"), str(doc.get("message", ""))
        except Exception:
            code, message = f"HTTP {status}", ""
        if code == "NOT_LEADER_OR_FOLLOWER" and "before the write was committed" in message:
            # appended, then leadership moved while acks=all waited: the new leader may
            # well have the record (Kafka's semantics too): unknown, not failed
            return "info", code + " (after append)"
        return ("fail" if code in CERTAIN_FAILURES else "info"), code

    # ---- producers ---------------------------------------------------------------------

    async def producer(self, p: int) -> None:
        n = 0
        while not self.stop_event.is_set():
            n += 1
            value = f"p{p}-{n}"
            op = self.h.invoke(f"producer-{p}", "produce", topic=self.topic, partition=p, values=[value],
                               idempotent=False)
            await self._post_json(op, p, value)
            await asyncio.sleep(self.op_interval_s)

    async def _post_json(self, op, p: int, value: str) -> None:
        url = f"{self.leader_url(p)}/v1/topics/{self.topic}/partitions/{p}/records?acks=all"
        try:
            async with self.session.post(url, json={"records": [{"value": value}]}) as r:
                body = await r.read()
                if r.status == 200:
                    self.h.ok(op, offsets=[json.loads(body)["offsets"][0]["offset"]])
                    return
                kind, code = self._classify(r.status, body)
                self.h.complete(op, kind, error=code)
        except aiohttp.ClientConnectorError as e:
            self.h.fail(op, f"connect: {e.__class__.__name__}")
        except Exception as e:  # timeouts, resets: unknown
            self.h.info(op, f"{e.__class__.__name__}: {e}"[:200])
        await self.refresh_metadata() if op.type != "ok" else None

    async def _producer_id(self) -> tuple[int, int]:
        while not self.stop_event.is_set():
            try:
                async with self.session.post(self._any_broker() + "/v1/producer-ids", json={}) as r:
                    if r.status == 200:
                        doc = await r.json()
                        return int(doc["producer_id"]), int(doc.get("producer_epoch", 0))
            except Exception:
                pass
            await asyncio.sleep(0.3)
        return -1, -1

    async def idempotent_producer(self, p: int, resend_max: int = 20) -> None:
        pid, epoch = await self._producer_id()
        seq, n = 0, 0
        while not self.stop_event.is_set():
            n += 1
            value = f"i{p}-{n}"
            batch = build_batch([Record(None, value.encode())], producer_id=pid, producer_epoch=epoch,
                                base_sequence=seq)
            for attempt in range(resend_max):
                op = self.h.invoke(f"idempotent-{p}", "produce", topic=self.topic, partition=p, values=[value],
                                   idempotent=True, producer_id=pid, sequence=seq, attempt=attempt)
                await self._post_raw(op, p, batch)
                if op.type == "ok":
                    seq += 1
                    break
                if op.error in ("OUT_OF_ORDER_SEQUENCE_NUMBER", "UNKNOWN_PRODUCER_ID", "INVALID_PRODUCER_EPOCH"):
                    break
                if self.stop_event.is_set():
                    break
                await asyncio.sleep(0.1 + 0.05 * attempt)
            else:
                op = None
            if op is None or op.type != "ok":
                pid, epoch = await self._producer_id()  # unknown outcome given up: start over
                seq = 0
            await asyncio.sleep(self.op_interval_s)

    async def _post_raw(self, op, p: int, batch: bytes) -> None:
        url = f"{self.leader_url(p)}/v1/topics/{self.topic}/partitions/{p}/records?acks=all"
        try:
            async with self.session.post(url, data=batch, headers={"Content-Type": RAW_BATCH,
                                                                   "Accept": "application/json"}) as r:
                body = await r.read()
                if r.status == 200:
                    self.h.ok(op, offsets=[json.loads(body)["offsets"][0]["offset"]])
                    return
                kind, code = self._classify(r.status, body)
                self.h.complete(op, kind, error=code)
        except aiohttp.ClientConnectorError as e:
            self.h.fail(op, f"connect: {e.__class__.__name__}")
        except Exception as e:
            self.h.info(op, f"{e.__class__.__name__}: {e}"[:200])
        await self.refresh_metadata()

    # ---- consumers ---------------------------------------------------------------------

    async def fetch(self, p: int, offset: int, final: bool = False, max_wait_ms: int = 300):
        op = self.h.invoke(f"consumer-{p}" if not final else "final-reader", "fetch", topic=self.topic,
                           partition=p, offset=offset, final=final)
        url = (f"{self.leader_url(p)}/v1/topics/{self.topic}/partitions/{p}/records"
               f"?offset={offset}&max_wait_ms={max_wait_ms}&max_bytes=262144")
        try:
            async with self.session.get(url, headers={"Accept": "application/json"}) as r:
                body = await r.read()
                if r.status == 200:
                    doc = json.loads(body)
                    recs = [[x["offset"], x.get("value")] for x in doc["records"]]
                    self.h.ok(op, records=recs, high_watermark=doc["high_watermark"],
                              next_offset=doc["next_offset"])
                    return doc
                kind, code = self._classify(r.status, body)
                self.h.complete(op, "fail", error=code)   # reads change nothing
        except Exception as e:
            self.h.fail(op, f"{e.__class__.__name__}"[:200])
        await self.refresh_metadata()
        return None

    async def consumer(self, p: int) -> None:
        while not self.stop_event.is_set():
            doc = await self.fetch(p, self.positions[p])
            if doc is not None:
                self.positions[p] = max(self.positions[p], doc["next_offset"])
            else:
                await asyncio.sleep(0.1)
            await asyncio.sleep(self.op_interval_s)

    async def committer(self, p: int, interval_s: float = 0.5) -> None:
        committed = 0
        while not self.stop_event.is_set():
            await asyncio.sleep(interval_s)
            pos = self.positions[p]
            if pos > committed:
                op = self.h.invoke(f"committer-{p}", "commit", group=self.group, topic=self.topic, partition=p,
                                   offset=pos)
                try:
                    async with self.session.post(f"{self._any_broker()}/v1/groups/{self.group}/offsets",
                                                 json={"offsets": [{"topic": self.topic, "partition": p,
                                                                    "offset": pos}]}) as r:
                        body = await r.read()
                        if r.status in (200, 204):
                            self.h.ok(op)
                            committed = pos
                        else:
                            kind, code = self._classify(r.status, body)
                            self.h.complete(op, "info" if kind == "info" else "fail", error=code)
                except aiohttp.ClientConnectorError as e:
                    self.h.fail(op, e.__class__.__name__)
                except Exception as e:
                    self.h.info(op, e.__class__.__name__)
            op = self.h.invoke(f"committer-{p}", "read_committed", group=self.group, topic=self.topic, partition=p)
            try:
                async with self.session.get(f"{self._any_broker()}/v1/groups/{self.group}/offsets") as r:
                    body = await r.read()
                    if r.status == 200:
                        offs = {(o["topic"], o["partition"]): o["offset"] for o in json.loads(body)["offsets"]}
                        self.h.ok(op, offset=offs.get((self.topic, p)))
                    else:
                        self.h.fail(op, self._classify(r.status, body)[1])
            except Exception as e:
                self.h.fail(op, e.__class__.__name__)

    # ---- run ---------------------------------------------------------------------------

    def start(self) -> None:
        for p in range(self.partitions):
            self.tasks.append(asyncio.create_task(
                self.idempotent_producer(p) if p in self.idempotent else self.producer(p)))
            self.tasks.append(asyncio.create_task(self.consumer(p)))
            self.tasks.append(asyncio.create_task(self.committer(p)))

    async def stop(self) -> None:
        self.stop_event.set()
        if self.tasks:
            await asyncio.wait(self.tasks, timeout=15)
            for t in self.tasks:
                t.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)
            self.tasks = []

    async def final_reads(self, deadline_s: float = 60.0) -> dict:
        """Once healed: read each partition from 0 to its high watermark (stable across two
        looks), marked final. Returns {partition: records read}."""
        out = {}
        end = time.monotonic() + deadline_s
        for p in range(self.partitions):
            while True:
                await self.refresh_metadata()
                first = await self.fetch(p, 0, max_wait_ms=0)
                await asyncio.sleep(1.0)
                second = await self.fetch(p, 0, max_wait_ms=0)
                if first and second and first["high_watermark"] == second["high_watermark"]:
                    hw = second["high_watermark"]
                    break
                if time.monotonic() > end:
                    raise RuntimeError(f"partition {p} did not settle for the final read")
            offset, n = 0, 0
            while True:  # at least one final fetch, even of an empty partition
                doc = await self.fetch(p, offset, final=True, max_wait_ms=0)
                if doc is None:
                    if time.monotonic() > end:
                        raise RuntimeError(f"final read of partition {p} failed at offset {offset}")
                    await asyncio.sleep(0.3)
                    continue
                n += len(doc["records"])
                if doc["next_offset"] >= hw or doc["next_offset"] <= offset:
                    break
                offset = doc["next_offset"]
            out[p] = n
        return out
