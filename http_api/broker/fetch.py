"""Fetch routes of a partition (the leader only): `GET .../records` (long polls bounded by
`fetch_max_wait_ms`; JSON, CBOR or raw batches), `GET .../offsets` (log start, high
watermark, or the first offset at a timestamp) and `POST .../delete-records`.
"""
from __future__ import annotations

import asyncio

from aiohttp import web

from http_api.broker import tiering
from http_api.broker.context import Routes, int_param, json_response, partition_param
from http_api.wire import codecs
from http_api.wire.codecs import CBOR, JSON, RAW_BATCH
from partitions import internal_topics
from partitions.errors import ErrorCode, KraftlogError
from partitions.log import transactions as txn


class FetchRoutes(Routes):
    """Consumer fetch, offsets and delete-records handlers."""

    async def fetch(self, request: web.Request) -> web.Response:
        return await self.ctx.measured(self._fetch, request, self.metrics.fetch_requests, self.metrics.fetch_latency)

    async def _fetch(self, request: web.Request) -> web.Response:
        name = request.match_info["topic"]
        partition = partition_param(request)
        q = request.query
        offset = int_param(q.get("offset"), "offset")
        max_bytes = min(int_param(q.get("max_bytes"), "max_bytes", default=self.config.fetch_default_max_bytes,
                                   minimum=1), self.config.fetch_max_bytes)
        min_bytes = int_param(q.get("min_bytes"), "min_bytes", default=1)
        max_wait_ms = min(int_param(q.get("max_wait_ms"), "max_wait_ms", default=0),
                          self.config.fetch_max_wait_ms)
        media = codecs.negotiate_response_type(request.headers.get("Accept"), JSON)
        try:
            isolation = txn.parse_isolation_level(q.get("isolation_level"))
        except ValueError as e:
            raise KraftlogError(ErrorCode.INVALID_REQUEST, str(e)) from None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max_wait_ms / 1000
        # below the local log start of a tiered partition: the remote store (tiering.py)
        res = await tiering.remote_fetch(self.ctx, name, partition, offset, max_bytes)
        remote = res is not None
        if res is None:
            res = await self.rm.fetch(name, partition, offset, max_bytes=max_bytes, min_bytes=min_bytes,
                                      max_wait_ms=max_wait_ms)
        # transactions (partitions/log/transactions.py): the LSO, and read_committed's view
        while True:
            data, fetched_next = res.records, res.next_offset
            lg = self.rm.logs.get((name, partition))
            lso = res.high_watermark
            if lg is None or getattr(lg, "transactions", None) is None:
                break
            lso = lg.last_stable_offset(res.high_watermark)
            if isolation != txn.READ_COMMITTED:
                break
            aborted = lg.aborted_transactions(offset, lso)
            if remote:   # records the store served: the aborted transactions its indexes hold too
                aborted = tiering.merge_aborted(aborted, await tiering.remote_aborted_transactions(
                    self.ctx, name, partition, offset, min(lso, res.next_offset)))
            data, fetched_next = txn.filter_read_committed(data, offset, lso, aborted)
            remaining_ms = int((deadline - loop.time()) * 1000)
            if data or fetched_next > offset or remote or remaining_ms <= 0 or self.rm.closing:
                break
            # only records above the LSO (an open transaction): the long poll waits on, for
            # more data or the marker that moves the LSO, instead of answering at once
            res = await self.rm.fetch(name, partition, offset, max_bytes=max_bytes,
                                      min_bytes=len(res.records) + 1, max_wait_ms=remaining_ms)
        self.metrics.fetch_bytes.inc(len(data))
        if media == RAW_BATCH:
            return web.Response(body=data, content_type=RAW_BATCH, headers={
                codecs.HEADER_HIGH_WATERMARK: str(res.high_watermark),
                codecs.HEADER_NEXT_OFFSET: str(fetched_next),
                codecs.HEADER_LOG_START_OFFSET: str(res.log_start_offset),
                "X-Kraftlog-Last-Stable-Offset": str(lso),
            })
        records, next_offset = codecs.decode_fetched(data, offset, binary=(media == CBOR))
        return json_response({"records": records, "next_offset": max(next_offset, fetched_next)
                              if isolation == txn.READ_COMMITTED else next_offset,
                              "high_watermark": res.high_watermark,
                              "last_stable_offset": lso,
                              "log_start_offset": res.log_start_offset}, 200, media)

    async def offsets(self, request: web.Request) -> web.Response:
        name = request.match_info["topic"]
        partition = partition_param(request)
        ts = request.query.get("timestamp")
        if ts is not None:
            t = int_param(ts, "timestamp")
            local = self.rm.offset_for_timestamp(name, partition, t)
            return json_response({"offset": await tiering.offset_for_timestamp(self.ctx, name, partition, t, local)})
        doc = self.rm.offsets(name, partition)
        lg = self.rm.logs.get((name, partition))
        txn_state = getattr(lg, "transactions", None) if lg is not None else None
        if txn_state is not None and txn_state.epochs:
            # a partition that has seen transactions: ListOffsets LATEST of a read_committed
            # consumer (partitions/log/transactions.py); elsewhere it is the high watermark
            doc["last_stable_offset"] = lg.last_stable_offset(doc["high_watermark"])
        return json_response(await tiering.offsets_doc(self.ctx, name, partition, doc))

    async def delete_records(self, request: web.Request) -> web.Response:
        name = request.match_info["topic"]
        internal_topics.check_client_write(name, "delete-records")
        partition = partition_param(request)
        doc = await self.ctx.read_document(request)
        before = doc.get("before_offset") if isinstance(doc, dict) else None
        if isinstance(before, bool) or not isinstance(before, int) or before < -1:
            raise KraftlogError(ErrorCode.INVALID_REQUEST,
                                'before_offset: body must be {"before_offset": N} with N >= 0 '
                                "(or -1 for the high watermark)")
        remote_start = await tiering.delete_records(self.ctx, name, partition, before)
        lso = await self.rm.delete_records(name, partition, before)
        if remote_start is not None:   # a tiered partition: the log start is the remote one
            lso = min(lso, remote_start)
        return json_response({"log_start_offset": lso})
