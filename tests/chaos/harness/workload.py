"""Client workloads against a ChaosCluster, recording every operation in a History.

- one producer per partition, acks=all, one record per request, unique values:
  plain JSON producers (never resend a value) and idempotent raw-batch producers (a
  producer id from POST /v1/producer-ids, a sequence per partition; after an unknown
  outcome they resend the same batch, same sequence, so a duplicate is a broker bug);
- one consumer per partition reading from the leader with long polls (fetch ops carry the
  records and the high watermark the broker reported);
- one group committer per partition committing the consumer's position and reading the
  committed offsets back;
- a compacted topic next to it (`cleanup.policy=compact`, small segments, a low
  `min.cleanable.dirty.ratio`, a short `delete.retention.ms`): per partition one acks=all
  producer overwriting a few keys again and again, some writes tombstones (value null);
  every record carries its unique write id in the header `w` (tombstones included), so
  reads name the write they saw; one consumer per partition;
- `configure_offsets_topic()`: `__consumer_offsets` (compacted, created by the first group
  call) gets small segments and a low dirty ratio, so the committed offsets are compacted
  while coordinators move;
- `transactions=True`: the transactional workload of `txn_workload.py` next to it
  (transactional producers over two more topics, read_committed consumers);
- `final_reads()` once the faults are healed: every partition read from 0 to its HW;
  `final_committed_reads()`: a fresh fetch of the group's committed offsets.

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

TOPIC_CONFIGS = {"segment.bytes": "16384"}   # segments roll (retention.ms stays 7 days: nothing deleted)
COMPACTED_TOPIC_CONFIGS = {"cleanup.policy": "compact", "segment.bytes": "4096", "segment.ms": "2000",
                           "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "1000"}
OFFSETS_TOPIC = "__consumer_offsets"
OFFSETS_TOPIC_CONFIGS = {"segment.bytes": "4096", "segment.ms": "2000", "min.cleanable.dirty.ratio": "0.01"}
WRITE_ID_HEADER = "w"

CERTAIN_FAILURES = {"NOT_LEADER_OR_FOLLOWER", "NOT_ENOUGH_REPLICAS", "UNKNOWN_TOPIC_OR_PARTITION",
                    "INVALID_REQUEST", "CORRUPT_MESSAGE"}
RAW_BATCH = "application/vnd.kraftlog.batch"


async def read_partition_to(fetch, name: str, bound: int, end: float) -> int:
    """The final read of partition `name` from offset 0 up to `bound` with `fetch(offset)`
    (a fetch answer, or None when it failed: retried until monotonic time `end`); at least
    one fetch, even of an empty partition. Returns how many records it read."""
    offset, n = 0, 0
    while True:
        doc = await fetch(offset)
        if doc is None:
            if time.monotonic() > end:
                raise RuntimeError(f"final read of partition {name} failed at offset {offset}")
            await asyncio.sleep(0.3)
            continue
        n += len(doc["records"])
        if doc["next_offset"] >= bound or doc["next_offset"] <= offset:
            return n
        offset = doc["next_offset"]


class Workload:
    """Producers, consumers and group committers for one topic; producers and consumers for
    a compacted topic (`compacted_topic`, None for none)."""

    def __init__(self, cluster, history: History, topic: str = "chaos", partitions: int = 3, seed: int = 0,
                 idempotent_every: int = 2, request_timeout_s: float = 8.0, op_interval_s: float = 0.02,
                 leader_check_s: float = 0.5,
                 group: str = "chaos-group", compacted_topic: Optional[str] = "chaos-compacted",
                 compacted_partitions: int = 2, compacted_keys: int = 8, tombstone_probability: float = 0.2,
                 topic_configs: Optional[dict] = None, compacted_topic_configs: Optional[dict] = None,
                 offsets_topic_configs: Optional[dict] = None, transactions: bool = False):
        self.c = cluster
        self.h = history
        self.topic = topic
        self.partitions = partitions
        self.compacted_topic = compacted_topic
        self.compacted_partitions = compacted_partitions if compacted_topic else 0
        self.compacted_keys = compacted_keys
        self.tombstone_probability = tombstone_probability
        self.topic_configs = dict(TOPIC_CONFIGS if topic_configs is None else topic_configs)
        self.compacted_topic_configs = dict(COMPACTED_TOPIC_CONFIGS if compacted_topic_configs is None
                                            else compacted_topic_configs)
        self.offsets_topic_configs = dict(OFFSETS_TOPIC_CONFIGS if offsets_topic_configs is None
                                          else offsets_topic_configs)
        self.rng = random.Random(seed)
        self.idempotent = {p for p in range(partitions) if idempotent_every and p % idempotent_every == 1}
        self.timeout = aiohttp.ClientTimeout(total=request_timeout_s)
        self.op_interval_s = op_interval_s
        self.group = group
        self.leaders: dict[tuple[str, int], int] = {}
        self.leader_epochs: dict[tuple[str, int], int] = {}
        # a produce unanswered this long looks at metadata (again every this long) and is
        # abandoned once another leader is named (issue 24: writers that follow metadata)
        self.leader_check_s = leader_check_s
        self.positions: dict[tuple[str, int], int] = {tp: 0 for tp in self.topic_partitions()}
        self.stop_event = asyncio.Event()
        self.session: Optional[aiohttp.ClientSession] = None
        self.tasks: list[asyncio.Task] = []
        self.txn = None
        if transactions:
            from tests.chaos.harness.txn_workload import TxnWorkload
            self.txn = TxnWorkload(self, seed=seed)

    # ---- plumbing ----------------------------------------------------------------------

    async def __aenter__(self):
        # secure cluster: the cluster CA and the super user admin's credentials (cluster.py)
        tls = {"ssl": self.c.ssl_context} if self.c.ssl_context is not None else {}
        self.session = aiohttp.ClientSession(timeout=self.timeout, headers=self.c.auth_header(),
                                             connector=aiohttp.TCPConnector(limit=64, force_close=False, **tls))
        return self

    async def __aexit__(self, *exc):
        await self.stop()
        await self.session.close()

    def topic_partitions(self) -> list[tuple[str, int]]:
        """Every (topic, partition) the workload writes."""
        return [(self.topic, p) for p in range(self.partitions)] + \
               [(self.compacted_topic, p) for p in range(self.compacted_partitions)]

    def _any_broker(self) -> str:
        ids = [i for i in self.c.ids if self.c.alive("broker", i)] or list(self.c.ids)
        return self.c.direct_url(self.rng.choice(ids))

    def _merge_metadata(self, doc) -> None:
        """Per partition, the answer with the highest leader epoch wins: a cut-off or lagging
        broker's stale view never hides a newer leader."""
        for t in (doc or {}).get("topics", []):
            if t["name"] in (self.topic, self.compacted_topic) or (self.txn and t["name"] in self.txn.topic_names()):
                for p in t["partitions"]:
                    key = (t["name"], p["partition"])
                    epoch = p.get("leader_epoch", -1)
                    if key not in self.leaders or epoch >= self.leader_epochs.get(key, -1):
                        self.leaders[key] = p["leader"]
                        self.leader_epochs[key] = epoch

    async def refresh_metadata(self, wait_s: float = 0.5) -> None:
        """Ask every live broker at once; merge what arrives within `wait_s` (later answers
        are merged when they come: a paused or cut-off broker does not hold the writer up)."""
        async def one(url: str):
            try:
                async with self.session.get(url + "/v1/metadata", timeout=aiohttp.ClientTimeout(total=2)) as r:
                    return await r.json()
            except Exception:
                return None
        ids = [i for i in self.c.ids if self.c.alive("broker", i)] or list(self.c.ids)
        tasks = [asyncio.ensure_future(one(self.c.direct_url(i))) for i in ids]
        for t in tasks:
            t.add_done_callback(lambda f: self._merge_metadata(f.result()) if not f.cancelled() else None)
        await asyncio.wait(tasks, timeout=wait_s)

    async def _send_following(self, key: tuple, send) -> tuple:
        """Run `send()` (-> (status, body)); while it waits, look at metadata every
        `leader_check_s` and give up once another leader with a higher epoch is named.
        -> ("answer", status, body) or ("moved", None, None); exceptions propagate."""
        leader, epoch = self.leaders.get(key, -1), self.leader_epochs.get(key, -1)
        req = asyncio.ensure_future(send())
        try:
            while True:
                done, _ = await asyncio.wait({req}, timeout=self.leader_check_s)
                if done:
                    status, body = req.result()
                    return "answer", status, body
                await self.refresh_metadata(wait_s=self.leader_check_s / 2)
                if self.leader_epochs.get(key, -1) > epoch and self.leaders.get(key, -1) != leader:
                    return "moved", None, None
        finally:
            if not req.done():
                req.cancel()

    def leader_url(self, p: int, topic: Optional[str] = None) -> str:
        leader = self.leaders.get((topic or self.topic, p), -1)
        return self.c.direct_url(leader) if leader in self.c.ids else self._any_broker()

    async def _create(self, name: str, partitions: int, configs: dict, end: float) -> None:
        body = {"name": name, "partitions": partitions, "replication_factor": len(self.c.ids),
                "configs": dict(configs, **{"min.insync.replicas": str(min(2, len(self.c.ids)))})}
        last = None
        while True:
            try:
                async with self.session.post(self._any_broker() + "/v1/topics", json=body) as r:
                    if r.status in (201, 409):
                        return
                    last = f"HTTP {r.status} {(await r.read())[:200]!r}"
            except Exception as e:
                last = repr(e)
            if time.monotonic() > end:
                raise RuntimeError(f"could not create the topic {name!r}: {last}")
            await asyncio.sleep(0.3)

    async def create_topic(self, deadline_s: float = 30.0) -> None:
        """Create the topic and the compacted topic; wait until every partition has a leader."""
        end = time.monotonic() + deadline_s
        await self._create(self.topic, self.partitions, self.topic_configs, end)
        if self.compacted_topic:
            await self._create(self.compacted_topic, self.compacted_partitions, self.compacted_topic_configs, end)
        wanted = self.topic_partitions()
        if self.txn:
            await self.txn.create_topics(end)
            wanted += self.txn.topic_partitions()
        while any(self.leaders.get(tp, -1) < 0 for tp in wanted):
            if time.monotonic() > end:
                raise RuntimeError(f"partitions without a leader: {[tp for tp in wanted if self.leaders.get(tp, -1) < 0]}")
            await self.refresh_metadata()
            await asyncio.sleep(0.2)

    async def configure_offsets_topic(self, deadline_s: float = 60.0) -> None:
        """Have `__consumer_offsets` created (GET the group's coordinator) and give it
        `offsets_topic_configs` (small segments, low dirty ratio: compacted during the run)."""
        if not self.offsets_topic_configs:
            return
        end = time.monotonic() + deadline_s
        last = None
        while True:
            try:
                async with self.session.get(f"{self._any_broker()}/v1/groups/{self.group}/coordinator") as r:
                    body = await r.read()
                    if r.status == 200:
                        async with self.session.post(f"{self._any_broker()}/v1/topics/{OFFSETS_TOPIC}/configs",
                                                     json={"configs": self.offsets_topic_configs}) as r2:
                            body = await r2.read()
                            if r2.status == 200:
                                return
                            last = f"configs: HTTP {r2.status} {body[:200]!r}"
                    else:
                        last = f"coordinator: HTTP {r.status} {body[:200]!r}"
            except Exception as e:
                last = repr(e)
            if time.monotonic() > end:
                raise RuntimeError(f"could not configure {OFFSETS_TOPIC}: {last}")
            await asyncio.sleep(0.3)

    def _follow_hint(self, key: tuple, status: int, body: bytes) -> bool:
        """A NOT_LEADER_OR_FOLLOWER answer names the leader the answering broker knows
        (KIP-951's hint, `leader_id`): go there at once instead of after the next metadata
        look. The hint carries no epoch, so the recorded epoch stays as it was: any metadata
        answer overrides the hint. (Recording a guessed higher epoch made a stale hint
        outrank the real leader: a writer kept dialing a killed broker for 4.4 s.) True
        when it named another leader."""
        try:
            doc = json.loads(body)
            hint = int(doc.get("leader_id", -1)) if doc.get("error_code") == "NOT_LEADER_OR_FOLLOWER" else -1
        except (ValueError, TypeError, AttributeError):
            return False
        if hint < 0 or hint not in self.c.ids or hint == self.leaders.get(key, -1):
            return False
        self.leaders[key] = hint
        return True

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
            await self._post_json(op, p, {"value": value})
            await asyncio.sleep(self.op_interval_s)

    async def _post_json(self, op, p: int, record: dict, topic: Optional[str] = None) -> None:
        topic = topic or self.topic
        url = f"{self.leader_url(p, topic)}/v1/topics/{topic}/partitions/{p}/records?acks=all"

        async def send():
            async with self.session.post(url, json={"records": [record]}) as r:
                return r.status, await r.read()
        try:
            outcome, status, body = await self._send_following((topic, p), send)
            if outcome == "moved":   # abandoned while waiting: it may still commit
                self.h.info(op, "abandoned: the leader moved while the write waited")
                return
            if status == 200:
                self.h.ok(op, offsets=[json.loads(body)["offsets"][0]["offset"]])
                return
            kind, code = self._classify(status, body)
            self.h.complete(op, kind, error=code)
            if self._follow_hint((topic, p), status, body):
                return
        except aiohttp.ClientConnectorError as e:
            self.h.fail(op, f"connect: {e.__class__.__name__}")
        except Exception as e:  # timeouts, resets: unknown
            self.h.info(op, f"{e.__class__.__name__}: {e}"[:200])
        await self.refresh_metadata() if op.type != "ok" else None

    async def compacted_producer(self, p: int) -> None:
        """Overwrites `compacted_keys` keys again and again; some writes are tombstones."""
        topic = self.compacted_topic
        retention_ms = int(self.compacted_topic_configs.get("delete.retention.ms", 86_400_000))
        n = 0
        while not self.stop_event.is_set():
            n += 1
            wid, key = f"c{p}-{n}", f"k{self.rng.randrange(self.compacted_keys)}"
            tombstone = self.rng.random() < self.tombstone_probability
            op = self.h.invoke(f"compactor-{p}", "produce", topic=topic, partition=p, values=[wid], keys=[key],
                               tombstones=[tombstone], idempotent=False, compacted=True,
                               delete_retention_ms=retention_ms)
            record = {"key": key, "value": None if tombstone else f"{wid}:{key}", "headers": {WRITE_ID_HEADER: wid}}
            await self._post_json(op, p, record, topic=topic)
            await asyncio.sleep(self.op_interval_s)

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

        async def send():
            async with self.session.post(url, data=batch, headers={"Content-Type": RAW_BATCH,
                                                                   "Accept": "application/json"}) as r:
                return r.status, await r.read()
        try:
            outcome, status, body = await self._send_following((self.topic, p), send)
            if outcome == "moved":   # abandoned while waiting: resent (same sequence) to the new leader
                self.h.info(op, "abandoned: the leader moved while the write waited")
                return
            if status == 200:
                self.h.ok(op, offsets=[json.loads(body)["offsets"][0]["offset"]])
                return
            kind, code = self._classify(status, body)
            self.h.complete(op, kind, error=code)
            if self._follow_hint((self.topic, p), status, body):
                return
        except aiohttp.ClientConnectorError as e:
            self.h.fail(op, f"connect: {e.__class__.__name__}")
        except Exception as e:
            self.h.info(op, f"{e.__class__.__name__}: {e}"[:200])
        await self.refresh_metadata()

    # ---- consumers ---------------------------------------------------------------------

    async def fetch(self, p: int, offset: int, final: bool = False, max_wait_ms: int = 300,
                    topic: Optional[str] = None):
        """One fetch, recorded: records as [offset, value], or for the compacted topic
        [offset, write id, key, value]."""
        topic = topic or self.topic
        compacted = topic == self.compacted_topic
        extra = {"compacted": True} if compacted else {}
        name = f"consumer-{p}" if topic == self.topic else f"consumer-{topic}-{p}"
        op = self.h.invoke(name if not final else "final-reader", "fetch", topic=topic,
                           partition=p, offset=offset, final=final, **extra)
        url = (f"{self.leader_url(p, topic)}/v1/topics/{topic}/partitions/{p}/records"
               f"?offset={offset}&max_wait_ms={max_wait_ms}&max_bytes=262144")
        try:
            async with self.session.get(url, headers={"Accept": "application/json"}) as r:
                body = await r.read()
                if r.status == 200:
                    doc = json.loads(body)
                    if compacted:
                        recs = [[x["offset"], (x.get("headers") or {}).get(WRITE_ID_HEADER), x.get("key"),
                                 x.get("value")] for x in doc["records"]]
                    else:
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

    async def consumer(self, p: int, topic: Optional[str] = None) -> None:
        tp = (topic or self.topic, p)
        while not self.stop_event.is_set():
            doc = await self.fetch(p, self.positions[tp], topic=tp[0])
            if doc is not None:
                self.positions[tp] = max(self.positions[tp], doc["next_offset"])
            else:
                await asyncio.sleep(0.1)
            await asyncio.sleep(self.op_interval_s)

    async def committer(self, p: int, interval_s: float = 0.5) -> None:
        committed = 0
        while not self.stop_event.is_set():
            await asyncio.sleep(interval_s)
            pos = self.positions[(self.topic, p)]
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
        for p in range(self.compacted_partitions):
            self.tasks.append(asyncio.create_task(self.compacted_producer(p)))
            self.tasks.append(asyncio.create_task(self.consumer(p, self.compacted_topic)))
        if self.txn:
            self.txn.start()

    async def stop(self) -> None:
        self.stop_event.set()
        if self.txn:
            await self.txn.stop()
        if self.tasks:
            await asyncio.wait(self.tasks, timeout=15)
            for t in self.tasks:
                t.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)
            self.tasks = []

    async def final_reads(self, deadline_s: float = 60.0) -> dict:
        """Once healed: read each partition (of both topics) from 0 to its high watermark
        (stable across two looks), marked final. Returns {"topic-partition": records read}."""
        out = {}
        end = time.monotonic() + deadline_s
        for topic, p in self.topic_partitions():
            while True:
                await self.refresh_metadata()
                first = await self.fetch(p, 0, max_wait_ms=0, topic=topic)
                await asyncio.sleep(1.0)
                second = await self.fetch(p, 0, max_wait_ms=0, topic=topic)
                if first and second and first["high_watermark"] == second["high_watermark"]:
                    hw = second["high_watermark"]
                    break
                if time.monotonic() > end:
                    raise RuntimeError(f"partition {topic}-{p} did not settle for the final read")
            out[f"{topic}-{p}"] = await read_partition_to(
                lambda o, p=p, topic=topic: self.fetch(p, o, final=True, max_wait_ms=0, topic=topic),
                f"{topic}-{p}", hw, end)
        if self.txn:
            out.update(await self.txn.final_reads(deadline_s))
        return out

    async def final_committed_reads(self, deadline_s: float = 60.0) -> dict:
        """Once healed and the committers stopped: a fresh fetch of the group's committed
        offsets (one `read_committed` op per partition, marked final). {partition: offset}."""
        end = time.monotonic() + deadline_s
        while True:
            ops = {p: self.h.invoke("final-reader", "read_committed", group=self.group, topic=self.topic,
                                    partition=p, final=True) for p in range(self.partitions)}
            error = None
            try:
                async with self.session.get(f"{self._any_broker()}/v1/groups/{self.group}/offsets") as r:
                    body = await r.read()
                    if r.status == 200:
                        offs = {(o["topic"], o["partition"]): o["offset"] for o in json.loads(body)["offsets"]}
                        for p, op in ops.items():
                            self.h.ok(op, offset=offs.get((self.topic, p)))
                        return {p: offs.get((self.topic, p)) for p in ops}
                    error = self._classify(r.status, body)[1]
            except Exception as e:
                error = e.__class__.__name__
            for op in ops.values():
                self.h.fail(op, error)
            if time.monotonic() > end:
                raise RuntimeError(f"the final fetch of committed offsets failed: {error}")
            await asyncio.sleep(0.3)
