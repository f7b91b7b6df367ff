"""Internal replication routes (broker to broker; wire format in `replica_client.py`):
`POST /internal/v1/replica-fetch` (a follower's batched long poll) and
`POST /internal/v1/epoch-end-offsets` (OffsetsForLeaderEpoch). They need the token of the
cluster secret when one is set (checked by the app's middleware).
"""
from __future__ import annotations

import logging

from aiohttp import web

from http_api.broker import replica_client
from http_api.broker.context import Routes, json_response
from partitions.errors import ErrorCode, KraftlogError
from partitions.replication.loop_share import LoopSlice
from partitions.replication.replica_state import ReplicaFetchRequest

log = logging.getLogger("kraftlog.broker")

PARSE_CHUNK_PARTITIONS = 1024   # a replica fetch's partitions parsed per clock read


class ReplicaRoutes(Routes):
    """Leader-side handlers of follower fetches."""

    async def replica_fetch(self, request: web.Request) -> web.Response:
        """A follower's batched long poll for every partition it follows from this leader."""
        doc = await self.ctx.read_document(request)
        try:
            replica_id = int(doc["replica_id"])
            broker_epoch = int(doc.get("broker_epoch", -1))
            parts = []
            # a full fetch names tens of thousands: parsed in slices of the loop's time (issue 25)
            async for chunk in LoopSlice().chunks(doc["partitions"], PARSE_CHUNK_PARTITIONS):
                parts.extend(ReplicaFetchRequest(str(e["topic"]), int(e["partition"]), int(e["offset"]),
                                                 int(e["leader_epoch"]), int(e.get("high_watermark", -1)))
                             for e in chunk)
            max_wait_ms = min(max(0, int(doc.get("max_wait_ms", 0))), self.config.fetch_max_wait_ms)
            max_bytes = min(max(1, int(doc.get("max_bytes", self.config.fetch_max_bytes))),
                            self.config.fetch_max_bytes)
            part_max = min(max(1, int(doc.get("partition_max_bytes", self.config.fetch_default_max_bytes))),
                           max_bytes)
        except (KeyError, TypeError, ValueError, AttributeError):
            raise KraftlogError(ErrorCode.INVALID_REQUEST,
                                "replica-fetch body needs replica_id and partitions: [{topic, partition, offset, "
                                "leader_epoch}]") from None
        try:
            session = doc.get("session_id")
            if session is not None:   # a follower with incremental fetch sessions (KIP-227)
                session_id, session_epoch = int(session), int(doc.get("session_epoch", 0))
                forgotten = [(str(e["topic"]), int(e["partition"])) for e in doc.get("forgotten", ())]
        except (KeyError, TypeError, ValueError, AttributeError):
            raise KraftlogError(ErrorCode.INVALID_REQUEST,
                                "replica-fetch session_id and session_epoch must be integers, forgotten "
                                "[{topic, partition}]") from None
        extra: dict = {}
        if session is None:   # a follower without sessions: a full fetch, answered in full
            results = await self.rm.replica_fetch(replica_id, parts, max_bytes=max_bytes, partition_max_bytes=part_max,
                                                  max_wait_ms=max_wait_ms, broker_epoch=broker_epoch)
            answered = [((req.topic, req.partition), res) for req, res in zip(parts, results)]
        else:
            sid, session_error, answered = await self.rm.replica_fetch_session(
                replica_id, session_id, session_epoch, parts, forgotten, max_bytes=max_bytes,
                partition_max_bytes=part_max, max_wait_ms=max_wait_ms, broker_epoch=broker_epoch)
            extra["session_id"] = sid
            if session_error:
                extra["session_error"] = session_error
        entries, chunks = [], []
        for (topic, partition), res in answered:
            if isinstance(res, KraftlogError):
                entries.append(replica_client.error_entry(topic, partition, res))
            else:
                entries.append({"topic": topic, "partition": partition, "size": len(res.records),
                                "high_watermark": res.high_watermark, "log_start_offset": res.log_start_offset,
                                "log_end_offset": res.log_end_offset})
                chunks.append(res.records)
        head = replica_client.encode_fetch_header(entries, **extra)
        resp = web.StreamResponse(headers={"Content-Type": replica_client.REPLICA_FETCH_MEDIA})
        body_bytes = sum(len(c) for c in chunks)
        self.metrics.replica_fetch_requests.inc()
        self.metrics.replica_fetch_bytes.inc(body_bytes)
        resp.content_length = len(head) + body_bytes
        if self.rm.closing:
            resp.force_close()   # stopping: the follower must not re-fetch on this connection
        try:
            await resp.prepare(request)
            await resp.write(head)
            for c in chunks:
                if len(c):
                    await resp.write(c)
            await resp.write_eof()
        except ConnectionResetError:
            # the follower gave up on this request (its timeout) and closed the connection:
            # it sends the request again; nothing to answer and nothing wrong here
            log.debug("replica fetch of broker %s: the follower closed the connection before the answer",
                      doc.get("replica_id") if isinstance(doc, dict) else None)
        return resp

    async def epoch_end_offsets(self, request: web.Request) -> web.Response:
        """OffsetsForLeaderEpoch, batched: where each requested epoch ends in the leader's log."""
        doc = await self.ctx.read_document(request)
        try:
            asks = [(str(e["topic"]), int(e["partition"]), int(e["epoch"]),
                     int(e["leader_epoch"]) if e.get("leader_epoch") is not None else None)
                    for e in doc["partitions"]]
        except (KeyError, TypeError, ValueError, AttributeError):
            raise KraftlogError(ErrorCode.INVALID_REQUEST,
                                "epoch-end-offsets body needs partitions: [{topic, partition, epoch, "
                                "leader_epoch}]") from None
        replica_id = doc.get("replica_id")
        if isinstance(replica_id, int) and not isinstance(replica_id, bool):
            # a follower truncating new partitions before it fetches them is alive too: the
            # silence rules count its broker as heard (`ReplicaState.fetch_request_from`)
            self.rm.core.fetch_request_from(replica_id, self.rm._clock_ms())
        out = []
        for topic, p, epoch, leader_epoch in asks:
            try:
                e, end = self.rm.epoch_end_offset(topic, p, epoch, leader_epoch)
                out.append({"topic": topic, "partition": p, "epoch": e, "end_offset": end})
            except KraftlogError as err:
                out.append(replica_client.error_entry(topic, p, err))
        return json_response({"partitions": out})
