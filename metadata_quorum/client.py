"""Broker-side access to the metadata quorum (asyncio + aiohttp).

- `ControllerClient`: finds the active controller and retries on NOT_CONTROLLER,
  connection errors, timeouts and retriable errors until the request deadline; raises
  KraftlogError otherwise. A try that times out moves to the other controllers at once. Writes carry a request id generated once per call and reused by its retries,
  so a retry after an unknown outcome is applied at most once.
- `MetadataFollower`: keeps a MetadataImage current by long-polling the controllers'
  metadata record feed (falls back to a snapshot when it is too far behind); a long poll
  moves to the new active controller as soon as the client finds one.
- `BrokerLifecycle`: registers the broker (a new incarnation id per process start),
  heartbeats every interval, tracks `broker_epoch` / `is_fenced`, drives controlled shutdown.
"""
from __future__ import annotations

import asyncio
import inspect
import json as _json
import logging
import time
import uuid
from typing import Any, Awaitable, Callable, Optional

import aiohttp

from partitions.errors import ErrorCode, KraftlogError
from metadata_quorum.feed import FeedState
from metadata_quorum.state_machine import FullCollectionHold
from partitions.replication.loop_share import LoopSlice

log = logging.getLogger("kraftlog.controller_client")

PREFIX = "/controller/v1"
FEED_CHUNK_RECORDS = 200      # metadata records parsed/replayed between looks at the clock (LoopSlice)
FEED_JSON_OFF_LOOP_BYTES = 64 * 1024   # larger feed answers are decoded in a thread


def _error_from_body(status: int, body: Any) -> KraftlogError:
    err = KraftlogError.from_body(body)
    if err is not None:
        return err
    return KraftlogError(ErrorCode.UNKNOWN_SERVER_ERROR, f"controller answered HTTP {status}: {body!r}")


class ControllerClient:
    """Talks to whichever controller is active. `controller_urls` are the controllers'
    HTTP base URLs (e.g. "http://127.0.0.1:9093").

    A silent controller (a stopped process or a cut host accepts connects, or not, and never
    answers) costs one try of at most `try_timeout_ms`: the client then asks the OTHER
    controllers at once, follows the active controller named by their NOT_CONTROLLER
    answers, and skips the silent one for `try_timeout_ms` (it is "suspect": the hints of
    the other controllers still name it until they have elected a new leader). While a try
    waits longer than `leader_check_after_ms` (0: never), the client asks the other
    controllers whom they follow and moves at once to a new leader they name. It pauses
    `retry_backoff_ms` only once every controller failed in a round. Long polls get their
    wait plus `long_poll_margin_ms`. `active_changed()` is set whenever a write's answer
    names a new active controller (the metadata feed follows it at once)."""

    def __init__(self, controller_urls: list, *, request_timeout_ms: int = 15_000,
                 retry_backoff_ms: int = 50, session: Optional[aiohttp.ClientSession] = None,
                 try_timeout_ms: int = 5_000, long_poll_margin_ms: int = 5_000,
                 leader_check_after_ms: int = 0, ssl_context=None, headers: Optional[dict] = None):
        if not controller_urls:
            raise ValueError("give at least one controller URL")
        self.controller_urls = [u.rstrip("/") for u in controller_urls]
        self.request_timeout_ms = request_timeout_ms
        self.retry_backoff_ms = retry_backoff_ms
        self.try_timeout_ms = try_timeout_ms
        self.long_poll_margin_ms = long_poll_margin_ms
        self.leader_check_after_ms = leader_check_after_ms
        self._session = session
        self._own_session = session is None
        self._ssl = ssl_context   # https:// controllers: the node's CA and client certificate
        self._headers = dict(headers or {})   # the broker's credentials (http_api/wire/auth.py)
        self._active: Optional[str] = None
        self._next = 0
        self._suspect: dict[str, float] = {}   # url -> monotonic time of its last timeout / connection error
        self._active_changed = asyncio.Event()

    async def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=2),
                                                  connector=aiohttp.TCPConnector(ssl=self._ssl)
                                                  if self._ssl is not None else None, headers=self._headers)
            self._own_session = True
        return self._session

    def twin(self) -> "ControllerClient":
        """A new client with the same controllers, limits and credentials and a session of its
        own: for another thread's event loop (`BrokerHeartbeatThread`)."""
        return ControllerClient(self.controller_urls, request_timeout_ms=self.request_timeout_ms,
                                retry_backoff_ms=self.retry_backoff_ms, try_timeout_ms=self.try_timeout_ms,
                                long_poll_margin_ms=self.long_poll_margin_ms,
                                leader_check_after_ms=self.leader_check_after_ms, ssl_context=self._ssl,
                                headers=self._headers)

    async def close(self) -> None:
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> "ControllerClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    @property
    def active_url(self) -> Optional[str]:
        return self._active

    def active_changed(self) -> asyncio.Event:
        """An event set the next time a new active controller is found."""
        return self._active_changed

    def _set_active(self, url: Optional[str]) -> None:
        if url == self._active:
            return
        self._active = url
        if url is not None:
            log.info("active controller is now %s", url)
            self._active_changed.set()
            self._active_changed = asyncio.Event()

    def _is_suspect(self, url: str, now: float) -> bool:
        failed_at = self._suspect.get(url)
        return failed_at is not None and now - failed_at < self.try_timeout_ms / 1000

    def _pick(self, asked: set) -> Optional[str]:
        """The controller to try next: the active one, else the next in turn; never one
        already asked in this round, nor a suspect one. None: the round is over."""
        now = time.monotonic()
        fresh = [u for u in self.controller_urls if u not in asked and not self._is_suspect(u, now)]
        if not fresh:
            return None
        if self._active in fresh:
            return self._active
        for _ in range(len(self.controller_urls)):
            url = self.controller_urls[self._next % len(self.controller_urls)]
            self._next += 1
            if url in fresh:
                return url
        return fresh[0]

    def _pick_after_round(self) -> str:
        """A new round found every controller suspect: the one that failed longest ago
        (with a single controller, it is asked again after the backoff)."""
        return min(self.controller_urls, key=lambda u: self._suspect.get(u, 0.0))

    async def _try(self, session: aiohttp.ClientSession, method: str, url: str, path: str, json: Any,
                   params: Optional[dict], timeout_s: float, hedge: bool) -> tuple:
        """One try -> (status, body, None), or (None, None, leader_url) when `url` has not
        answered yet and another controller names a different leader (asked every
        `leader_check_after_ms` while the try waits). Raises aiohttp/timeout errors of the try."""
        async def send() -> tuple:
            async with session.request(method, url + path, json=json, params=params,
                                       timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
                raw = await resp.read()
                try:
                    if len(raw) > FEED_JSON_OFF_LOOP_BYTES:   # a feed page of thousands of records
                        body = await asyncio.get_running_loop().run_in_executor(None, _json.loads, raw)
                    else:
                        body = _json.loads(raw)
                except ValueError:
                    body = None
                return resp.status, body

        if not hedge:
            status, body = await send()
            return status, body, None
        attempt = asyncio.ensure_future(send())
        check: Optional[asyncio.Future] = None
        every_s = self.leader_check_after_ms / 1000
        try:
            while not attempt.done():
                done, _ = await asyncio.wait({attempt}, timeout=every_s)
                if done:
                    break
                check = asyncio.ensure_future(self._leader_elsewhere(url, every_s))
                await asyncio.wait({attempt, check}, return_when=asyncio.FIRST_COMPLETED)
                if attempt.done():
                    break
                moved_to = check.result()
                check = None
                if moved_to is not None:
                    return None, None, moved_to
            status, body = await attempt
            return status, body, None
        finally:
            for task in (attempt, check):
                if task is not None and not task.done():
                    task.cancel()
                    try:
                        await task
                    except (asyncio.CancelledError, Exception):
                        pass

    async def _leader_elsewhere(self, url: str, timeout_s: float) -> Optional[str]:
        """The leader the other controllers name, if one of them names a leader other than
        `url`; None when they all still name `url` (or none answers within `timeout_s`)."""
        session = await self._get_session()

        async def leader_of(other: str) -> Optional[str]:
            try:
                async with session.get(other + PREFIX + "/status",
                                       timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
                    st = await resp.json(content_type=None)
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError):
                return None
            leader = (st or {}).get("leader_url") if isinstance(st, dict) else None
            leader = leader.rstrip("/") if leader else None
            return leader if leader in self.controller_urls and leader != url else None

        pending = {asyncio.ensure_future(leader_of(u)) for u in self.controller_urls if u != url}
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    if task.result() is not None:
                        return task.result()
            return None
        finally:
            for task in pending:
                task.cancel()

    async def request(self, method: str, path: str, *, json: Any = None, params: Optional[dict] = None,
                      timeout_ms: Optional[int] = None, try_timeout_ms: Optional[int] = None,
                      answered_by_active: bool = True) -> Any:
        """One logical request with retries until the deadline; returns the JSON body.
        `try_timeout_ms`: bound of one try (default `self.try_timeout_ms`).
        `answered_by_active`: a success proves the URL is the active controller (writes and
        require_active reads); False for reads any controller serves."""
        deadline = time.monotonic() + (timeout_ms or self.request_timeout_ms) / 1000
        per_try_s = (try_timeout_ms or self.try_timeout_ms) / 1000
        session = await self._get_session()
        last_error: Optional[BaseException] = None
        backoff = self.retry_backoff_ms / 1000
        asked: set = set()                 # asked in this round without an answer that helped
        forced: Optional[str] = None       # named by a NOT_CONTROLLER answer: ask it next

        hedge = try_timeout_ms is None and len(self.controller_urls) > 1 and self.leader_check_after_ms > 0

        async def pause() -> None:
            await asyncio.sleep(min(backoff, max(0.0, deadline - time.monotonic())))

        while True:
            url = forced or self._pick(asked)
            forced = None
            if url is None:  # every controller failed once: back off, then a new round
                await pause()
                asked.clear()
                url = self._pick(asked) or self._pick_after_round()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                status, body, moved_to = await self._try(session, method, url, path, json, params,
                                                         min(remaining, per_try_s), hedge)
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                # silent or gone: try the others at once, skip this one while it is suspect
                last_error = exc
                self._suspect[url] = time.monotonic()
                if self._active == url:
                    self._active = None
                asked.add(url)
                log.info("controller %s did not answer %s %s (%r); trying the others", url, method, path, exc)
                continue
            if moved_to is not None:
                # still waiting on `url` while the other controllers name a new leader: it is
                # deposed and silent (a slow but current leader is waited for)
                last_error = KraftlogError(ErrorCode.NOT_CONTROLLER, f"controller {url} did not answer and "
                                           f"the others name {moved_to} the leader", leader_url=moved_to)
                self._suspect[url] = time.monotonic()
                if self._active == url:
                    self._active = None
                asked.add(url)
                forced = moved_to
                log.info("controller %s did not answer %s %s; the others name %s the leader: asking it",
                         url, method, path, moved_to)
                continue
            self._suspect.pop(url, None)
            if status < 400:
                if answered_by_active:
                    self._set_active(url)
                return body
            err = _error_from_body(status, body)
            last_error = err
            if err.code is ErrorCode.NOT_CONTROLLER:
                hint = err.extra.get("leader_url")
                hint = hint.rstrip("/") if hint else None
                if self._active == url:
                    self._active = None
                if hint == url:  # just elected, not active yet: ask it again in a moment
                    await pause()
                    forced = url
                    continue
                asked.add(url)
                if hint and hint not in self.controller_urls and hint.startswith(("http://", "https://")):
                    self.controller_urls.append(hint)   # a controller added at run time (kraftlog quorum)
                    log.info("learned controller %s from %s", hint, url)
                if hint and hint in self.controller_urls and hint not in asked \
                        and not self._is_suspect(hint, time.monotonic()):
                    forced = hint
                continue
            if err.code.retriable and err.code is not ErrorCode.UNKNOWN_TOPIC_OR_PARTITION and err.code not in (
                    ErrorCode.FENCED_LEADER_EPOCH, ErrorCode.UNKNOWN_LEADER_EPOCH, ErrorCode.NOT_LEADER_OR_FOLLOWER):
                await pause()
                forced = url
                continue
            raise err
        if isinstance(last_error, KraftlogError):
            raise KraftlogError(last_error.code, f"gave up after the request deadline: {last_error.message}",
                                **last_error.extra)
        raise KraftlogError(ErrorCode.REQUEST_TIMED_OUT,
                            f"no active controller answered {method} {path} within the deadline "
                            f"(tried {', '.join(self.controller_urls)}; last error: {last_error!r})")

    # ------------------------------------------------------------------ brokers
    async def register_broker(self, broker_id: int, incarnation_id: str, url: str, rack: Optional[str] = None) -> int:
        """Returns the broker epoch (the metadata offset of the registration)."""
        body = await self.register_broker_full(broker_id, incarnation_id, url, rack)
        return body["broker_epoch"]

    async def register_broker_full(self, broker_id: int, incarnation_id: str, url: str,
                                   rack: Optional[str] = None, clean_shutdown: bool = True,
                                   kafka_address: Optional[str] = None) -> dict:
        return await self.request("POST", PREFIX + "/brokers/register", json={
            "broker_id": broker_id, "incarnation_id": incarnation_id, "url": url, "rack": rack,
            "clean_shutdown": clean_shutdown, "kafka_address": kafka_address})

    async def heartbeat(self, broker_id: int, broker_epoch: int, metadata_offset: int,
                        want_shutdown: bool = False, timeout_ms: Optional[int] = None,
                        log_reports: Optional[list] = None) -> dict:
        """-> {"broker_epoch", "fenced", "in_controlled_shutdown", "should_shutdown", "metadata_offset", ...}
        `log_reports`: this broker's logs of partitions awaiting unclean recovery."""
        body = {"broker_id": broker_id, "broker_epoch": broker_epoch, "metadata_offset": metadata_offset,
                "want_shutdown": want_shutdown}
        if log_reports:
            body["log_reports"] = log_reports
        return await self.request("POST", PREFIX + "/brokers/heartbeat", json=body, timeout_ms=timeout_ms)

    async def controlled_shutdown(self, broker_id: int, broker_epoch: int, metadata_offset: int = 0) -> dict:
        return await self.request("POST", PREFIX + "/brokers/controlled-shutdown", json={
            "broker_id": broker_id, "broker_epoch": broker_epoch, "metadata_offset": metadata_offset})

    async def alter_partition(self, broker_id: int, broker_epoch: int, topic: str, partition: int,
                              leader_epoch: int, partition_epoch: int, new_isr: list,
                              new_isr_broker_epochs: Optional[dict] = None) -> dict:
        """-> {"topic", "partition", "leader", "leader_epoch", "replicas", "isr", "partition_epoch"}.
        `new_isr_broker_epochs`: broker id -> the registration epoch its fetches came from."""
        body = {"broker_id": broker_id, "broker_epoch": broker_epoch, "topic": topic, "partition": partition,
                "leader_epoch": leader_epoch, "partition_epoch": partition_epoch, "new_isr": list(new_isr),
                "request_id": uuid.uuid4().hex}
        if new_isr_broker_epochs:
            body["new_isr_broker_epochs"] = {str(k): v for k, v in new_isr_broker_epochs.items()}
        return await self.request("POST", PREFIX + "/alter-partition", json=body)

    async def alter_partitions(self, broker_id: int, broker_epoch: int, items: list) -> list:
        """AlterPartition for many partitions in one request (issue 25). `items`: [{topic,
        partition, leader_epoch, partition_epoch, new_isr, new_isr_broker_epochs?}] ->
        one entry per item, in order: the new registration, or {error_code, message}."""
        body = {"broker_id": broker_id, "broker_epoch": broker_epoch, "request_id": uuid.uuid4().hex,
                "partitions": [dict(it, new_isr=list(it["new_isr"]),
                                    new_isr_broker_epochs={str(k): v for k, v in
                                                           (it.get("new_isr_broker_epochs") or {}).items()})
                               for it in items]}
        return (await self.request("POST", PREFIX + "/alter-partitions", json=body))["partitions"]

    async def report_unreachable(self, broker_id: int, broker_epoch: int, target_id: int) -> dict:
        """Tell the controller that connections to broker `target_id` are refused; it probes
        the broker itself and fences it at once if it is gone. -> {"target_id", "fenced"}"""
        return await self.request("POST", PREFIX + "/brokers/unreachable", json={
            "broker_id": broker_id, "broker_epoch": broker_epoch, "target_id": target_id})

    async def report_silent(self, broker_id: int, broker_epoch: int, target_id: int, silent_ms: int,
                            timeout_ms: Optional[int] = None) -> dict:
        """Tell the controller that broker `target_id` has been silent for `silent_ms` (its
        fetches or its answers to ours stopped: issue 24 part B). The controller fences it
        once its own heartbeats and a probe agree. -> {"target_id", "fenced", "suspected"}"""
        return await self.request("POST", PREFIX + "/brokers/unreachable", json={
            "broker_id": broker_id, "broker_epoch": broker_epoch, "target_id": target_id,
            "reason": "silent", "silent_ms": silent_ms}, timeout_ms=timeout_ms)

    async def allocate_producer_ids(self, broker_id: int, broker_epoch: int) -> tuple[int, int]:
        """-> (first_producer_id, block_size)"""
        body = await self.request("POST", PREFIX + "/producer-ids", json={
            "broker_id": broker_id, "broker_epoch": broker_epoch})
        return body["first_producer_id"], body["size"]

    # ------------------------------------------------------------------ admin
    async def create_topic(self, name: str, partitions: int, replication_factor: int,
                           configs: Optional[dict] = None) -> dict:
        """-> the topic as in metadata plus "configs" (API.md). One try waits the whole
        request deadline: a topic of thousands of partitions can take the controller longer
        than a short try (a broker's is one heartbeat interval), and each retry made it
        decide and propose them all again, until the deadline passed (504 under load)."""
        return await self.request("POST", PREFIX + "/topics", json={
            "name": name, "partitions": partitions, "replication_factor": replication_factor,
            "configs": configs or {}, "request_id": uuid.uuid4().hex}, try_timeout_ms=self.request_timeout_ms)

    async def delete_topic(self, name: str) -> dict:
        """-> {"deleted": name, "metadata_offset"}"""
        return await self.request("DELETE", PREFIX + f"/topics/{name}", params={"request_id": uuid.uuid4().hex})

    async def create_partitions(self, name: str, count: int) -> dict:
        return await self.request("POST", PREFIX + f"/topics/{name}/partitions", json={
            "count": count, "request_id": uuid.uuid4().hex}, try_timeout_ms=self.request_timeout_ms)  # as create_topic

    async def alter_configs(self, name: str, configs: dict) -> dict:
        """`configs`: key -> value, or None to delete the key. -> {"name", "configs"}"""
        return await self.request("POST", PREFIX + f"/topics/{name}/configs", json={
            "configs": configs, "request_id": uuid.uuid4().hex})

    async def elect_leaders(self, partitions: Optional[list] = None) -> dict:
        body = {} if partitions is None else {"partitions": [{"topic": t, "partition": p} for t, p in partitions]}
        return await self.request("POST", PREFIX + "/elect-leaders", json=body)

    # ---- security (metadata_quorum/controller_security.py): every answer carries
    # "metadata_offset", the offset to wait for before the change shows in a broker's image
    async def create_user(self, name: str, credential: dict) -> dict:
        """A new SCRAM user from a credential derived by the caller (DUPLICATE_RESOURCE if it exists)."""
        return await self.request("POST", PREFIX + "/security/users", json={
            "name": name, "credential": credential, "request_id": uuid.uuid4().hex})

    async def alter_user(self, name: str, credential: dict) -> dict:
        """Replace (or create) the SCRAM credential of `name`."""
        return await self.request("PUT", PREFIX + f"/security/users/{name}", json={
            "credential": credential, "request_id": uuid.uuid4().hex})

    async def delete_user(self, name: str) -> dict:
        return await self.request("DELETE", PREFIX + f"/security/users/{name}",
                                  params={"request_id": uuid.uuid4().hex})

    async def create_token(self, principal: str, token_id: str, token_hash: str,
                           lifetime_ms: Optional[int] = None) -> dict:
        """Store a bearer token by its hash (the caller made the token and keeps it)."""
        return await self.request("POST", PREFIX + "/security/tokens", json={
            "principal": principal, "token_id": token_id, "token_hash": token_hash, "lifetime_ms": lifetime_ms,
            "request_id": uuid.uuid4().hex})

    async def delete_token(self, token_id: str) -> dict:
        return await self.request("DELETE", PREFIX + f"/security/tokens/{token_id}",
                                  params={"request_id": uuid.uuid4().hex})

    async def create_acls(self, bindings: list) -> dict:
        """`bindings`: AclBinding.to_dict() objects (DUPLICATE_RESOURCE if one exists)."""
        return await self.request("POST", PREFIX + "/security/acls", json={
            "acls": bindings, "request_id": uuid.uuid4().hex})

    async def delete_acls(self, bindings: list) -> dict:
        """RESOURCE_NOT_FOUND if one of them does not exist (then none is removed)."""
        return await self.request("POST", PREFIX + "/security/acls/delete", json={
            "acls": bindings, "request_id": uuid.uuid4().hex})

    async def metadata_json(self, require_active: bool = True) -> dict:
        """The API.md `GET /v1/metadata` body plus "metadata_offset" and "controller_epoch".
        From the active controller (reads its own writes) unless require_active=False, in
        which case any controller may answer with the metadata offset it has reached."""
        return await self.request("GET", PREFIX + "/metadata",
                                  params={"require_active": "true" if require_active else "false"},
                                  answered_by_active=require_active)

    async def status(self) -> dict:
        return await self.request("GET", PREFIX + "/status", answered_by_active=False)

    async def metadata_records(self, after: int, max_wait_ms: int = 0, max_records: Optional[int] = None,
                               broker_id: Optional[int] = None) -> dict:
        """Feed records with offsets >= `after` (at most `max_records`, capped by the
        controller's page size), or a snapshot; "metadata_offset" is its applied offset.
        `broker_id`: the broker reading (the controller learns it has the records before
        `after`: QuorumController.note_metadata_offset)."""
        # runs=1: partition records may come as runs of columns (records.records_of_run,
        # FeedState reads both forms; a controller that predates runs ignores it)
        params = {"after": str(after), "max_wait_ms": str(max_wait_ms), "runs": "1"}
        if max_records is not None:
            params["max_records"] = str(max_records)
        if broker_id is not None:
            params["broker_id"] = str(broker_id)
        return await self.request("GET", PREFIX + "/metadata/records", params=params,
                                  timeout_ms=max_wait_ms + self.request_timeout_ms,
                                  try_timeout_ms=max_wait_ms + self.long_poll_margin_ms, answered_by_active=False)


class MetadataFollower:
    """Keeps `image` current from the controller feed, one WHOLE change at a time.

    The feed pages the record log (a topic of 10,000 partitions spans several answers);
    `FeedState` (metadata_quorum/feed.py, pure) buffers pages until they end at a batch
    boundary and replays the change into a new copy-on-write image. `on_change(image,
    changed_records)` (sync or async) runs once per whole change with the records applied
    (None after a snapshot replaced the whole image, or when a previous callback failed:
    the callee then looks at the whole image); `image` becomes the new image only once it
    returned, so `image` is always the change a reader (the broker's MetadataView) has
    published, never a partial one.

    Lag (`lag()`): the controller's applied offset seen in the last answer minus ours, and
    for how long we have been behind it (0 while caught up)."""

    def __init__(self, client: ControllerClient, on_change: Optional[Callable] = None, *,
                 max_wait_ms: int = 10_000, error_backoff_ms: int = 200,
                 records_per_request_max: Optional[int] = None, clock: Callable[[], float] = time.monotonic,
                 gc_freeze_min_records: int = 0, broker_id: Optional[int] = None):
        self.client = client
        self.broker_id = broker_id   # named in feed requests (None: an anonymous reader)
        self.on_change = on_change
        # a change of at least this many records (a broker fencing, a large create) is
        # fetched, built and applied with full garbage collections held off, and frozen out
        # of later ones when published (FullCollectionHold); 0: never touch the collector
        # (in-process tests). The broker passes GC_FREEZE_MIN_RECORDS_DEFAULT.
        self.gc_freeze_min_records = gc_freeze_min_records
        self._gc_hold = FullCollectionHold()
        self.max_wait_ms = max_wait_ms
        self.error_backoff_ms = error_backoff_ms
        self.records_per_request_max = records_per_request_max   # None: the controller's page size
        self._clock = clock
        self.feed = FeedState(clock=clock)
        self.image = self.feed.image
        self._advanced = asyncio.Event()
        self._stopped = False
        self._full_next = False          # a callback failed: hand over the whole image next time
        self.last_answer_at: Optional[float] = None   # clock() of the last feed answer

    @property
    def offset(self) -> int:
        return self.image.offset

    def stop(self) -> None:
        self._stopped = True

    def lag(self) -> tuple[int, int]:
        """(records behind the controller's last reported offset, ms behind: how long this
        broker has been behind it without catching up; 0 when caught up)."""
        return self.feed.lag()

    async def poll_once(self, max_wait_ms: Optional[int] = None) -> bool:
        """One feed request; True if the image changed."""
        return await self._apply(await self._fetch(max_wait_ms))

    async def _fetch(self, max_wait_ms: Optional[int] = None) -> dict:
        wait = self.max_wait_ms if max_wait_ms is None else max_wait_ms
        if self.feed.pending:
            wait = 0   # the rest of a batch is already committed: no long poll
        return await self._records(self.feed.next_offset, wait, self.broker_id)

    def _records(self, after: int, max_wait_ms: int, broker_id: Optional[int]) -> Awaitable[dict]:
        """One feed request from `after` (the regular ones name this broker, prefetches none)."""
        return self.client.metadata_records(after, max_wait_ms, max_records=self.records_per_request_max,
                                            broker_id=broker_id)

    def _prefetch_after(self, body: dict) -> Optional[int]:
        """The offset of the page after `body` when the controller said it has committed
        records beyond it (so the next request needs no long poll), else None. Called
        before `body` is accepted: the feed's next offset then moves by its records."""
        records = body.get("records")
        controller_offset = body.get("metadata_offset")
        if body.get("snapshot") is not None or not records or type(controller_offset) is not int:
            return None
        first = records[0].get("offset") if isinstance(records[0], dict) else None
        if first != self.feed.next_offset:
            return None
        after = first + len(records)
        return after if after < controller_offset else None

    def _prefetch(self, after: int) -> asyncio.Task:
        """Fetch the page at `after` now (no long poll) while the current one is applied.
        The request names no broker: the controller counts what a broker has from its
        regular requests, made once a change is applied (`QuorumController.
        note_metadata_offset`: a large fencing's ISR removals wait for it)."""
        return asyncio.ensure_future(self._records(after, 0, None))

    async def _prefetched(self, after: int, task: asyncio.Task) -> Optional[dict]:
        """The answer of a `_prefetch` when it still continues the feed (None: fetch again)."""
        try:
            body = await task   # cancelled only with run() itself: never swallowed
        except Exception as exc:   # the regular request retries (and follows a new controller)
            log.debug("metadata feed prefetch at %s failed: %s", after, exc)
            return None
        return body if after == self.feed.next_offset else None

    async def _apply(self, body: dict) -> bool:
        try:
            return await self._apply_change(body)
        finally:
            if not self.feed.pending:   # the change is published (or was dropped): collections back on
                self._gc_hold.release(freeze=True)

    def _large_change(self, body: dict) -> bool:
        if not self.gc_freeze_min_records:
            return False
        # the records up to the controller's applied offset are committed and come next
        # (a change's first page already tells how large it is)
        size = max(len(self.feed.pending) + len(body.get("records") or ()),
                   (body.get("metadata_offset") or 0) - self.feed.image.offset)
        snapshot = body.get("snapshot")
        if isinstance(snapshot, dict):
            size += sum(len(t.get("partitions") or ()) for t in snapshot.get("topics") or ())
        return size >= self.gc_freeze_min_records

    async def _apply_change(self, body: dict) -> bool:
        self.last_answer_at = self._clock()
        if self._large_change(body):
            self._gc_hold.hold()   # until published: the next pages' fetches run under it too
        steps = self.feed.accept_in_steps(body, FEED_CHUNK_RECORDS)
        turns = LoopSlice()
        while True:   # a change of thousands of partitions is built in slices: the loop serves meanwhile
            try:
                next(steps)
            except StopIteration as done:
                change = done.value
                break
            await turns.maybe_yield()
        if change is None:
            if body.get("cluster_id") and not self.image.cluster_id:
                self.image.cluster_id = body["cluster_id"]
            return False
        changed = None if self._full_next else change.records
        self._full_next = False
        if self.on_change is not None:
            try:
                res = self.on_change(change.image, changed)
                if inspect.isawaitable(res):
                    await res
            except asyncio.CancelledError:
                self._full_next = True
                raise
            except Exception:   # the next change hands over the whole image again
                self._full_next = True
                log.exception("metadata on_change callback failed")
        self.image = change.image
        self.feed.observe(self.image.offset)
        self._advanced.set()
        self._advanced = asyncio.Event()
        return True

    async def _fetch_following_active(self) -> Optional[dict]:
        """One feed request, abandoned (None) when the client finds a new active controller
        meanwhile: the next request goes to it instead of waiting on a controller that may
        be silent. Only the request is abandoned, never the applying of an answer."""
        changed = self.client.active_changed()
        fetch = asyncio.ensure_future(self._fetch())
        follow = asyncio.ensure_future(changed.wait())
        try:
            await asyncio.wait({fetch, follow}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            follow.cancel()
            if not fetch.done():
                fetch.cancel()
                try:
                    await fetch
                except (asyncio.CancelledError, Exception):
                    pass
        if fetch.cancelled():
            log.info("metadata feed follows the new active controller %s", self.client.active_url)
            return None
        return fetch.result()

    async def run(self) -> None:
        """Poll the feed and apply what it answers until stopped. While a page is applied,
        the next page is already being fetched when the controller has it committed (a
        change of tens of thousands of records spans several pages: the fetches no longer
        wait for the applies, issue 25)."""
        prefetch: Optional[tuple] = None   # (after, task)
        try:
            while not self._stopped:
                try:
                    body = None
                    if prefetch is not None:
                        (after, task), prefetch = prefetch, None
                        body = await self._prefetched(after, task)
                    if body is None:
                        body = await self._fetch_following_active()
                    if body is not None:
                        after = self._prefetch_after(body)
                        if after is not None:
                            prefetch = (after, self._prefetch(after))
                            await asyncio.sleep(0)   # its request goes out before this page is taken in
                        await self._apply(body)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    log.info("metadata feed poll failed: %s", exc)
                    self._gc_hold.release(freeze=False)   # not while the controller is away; the next page holds again
                    await asyncio.sleep(self.error_backoff_ms / 1000)
        finally:
            if prefetch is not None:
                prefetch[1].cancel()
            self._gc_hold.release(freeze=False)   # stopped in the middle of a change

    async def wait_for_offset(self, offset: int, timeout: float) -> bool:
        """Wait until the image has applied `offset` records; False on timeout."""
        deadline = time.monotonic() + timeout
        while self.image.offset < offset:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            try:
                await asyncio.wait_for(self._advanced.wait(), remaining)
            except asyncio.TimeoutError:
                return self.image.offset >= offset
        return True


class BrokerLifecycle:
    """Registration + heartbeats of one broker process. Invariant: `broker_epoch` is the
    epoch of this process's registration (None before it succeeds)."""

    def __init__(self, client: ControllerClient, broker_id: int, url: str, rack: Optional[str] = None,
                 metadata_follower: Optional[MetadataFollower] = None, *,
                 heartbeat_interval_ms: Optional[int] = None):
        self.client = client
        self.broker_id = broker_id
        self.url = url
        self.rack = rack
        self.follower = metadata_follower
        self.incarnation_id = uuid.uuid4().hex
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.broker_epoch: Optional[int] = None
        self.is_fenced = True
        self.in_controlled_shutdown = False
        self.should_shutdown = False
        self.last_heartbeat: Optional[dict] = None
        self.session_timeout_ms: Optional[int] = None   # the controller's broker_session_timeout_ms
        self._heartbeat_controller: Optional[str] = None  # the controller that answered the last heartbeat
        # monotonic time (s) of the last heartbeat or registration the controller answered
        # (issue 24 part D: a leader that has lost the controller stops leading)
        self.last_heartbeat_ok: Optional[float] = None
        self._task: Optional[asyncio.Task] = None
        self._state_changed = asyncio.Event()
        self._paused = False
        # did this process find its logs cleanly shut down? (False: its unflushed tail may be
        # lost, so it must not lead from a shrunken ISR; KIP-966)
        self.clean_shutdown = True
        # () -> [{topic, partition, last_epoch, log_end_offset}] for partitions awaiting
        # unclean recovery that list this broker (sent with every heartbeat)
        self.log_reports_fn: Optional[Callable[[], list]] = None
        # the reports built on the loop after the last answer, for the heartbeat thread's next
        # heartbeat (it does not walk the broker's state itself)
        self.pending_log_reports: list = []
        self._heartbeat_thread = None   # BrokerHeartbeatThread, when heartbeats are off the loop
        self._reregistering: Optional[asyncio.Task] = None
        self.kafka_address: Optional[str] = None   # "host:port" of this broker's Kafka listener

    def _metadata_offset(self) -> int:
        return self.follower.image.offset if self.follower is not None else 0

    async def register(self) -> int:
        body = await self.client.register_broker_full(self.broker_id, self.incarnation_id, self.url, self.rack,
                                                      clean_shutdown=self.clean_shutdown,
                                                      kafka_address=self.kafka_address)
        self._update(body)
        if self.heartbeat_interval_ms is None:
            self.heartbeat_interval_ms = body.get("heartbeat_interval_ms", 2000)
        # a try on a silent controller costs at most one heartbeat interval; a heartbeat
        # gives up after the session timeout (the next one starts fresh)
        self.client.try_timeout_ms = min(self.client.try_timeout_ms, self.heartbeat_interval_ms)
        self.session_timeout_ms = body.get("session_timeout_ms", self.session_timeout_ms)
        return self.broker_epoch

    def heartbeat_silence_ms(self) -> Optional[int]:
        """How long no heartbeat has succeeded (None before the first one)."""
        if self.last_heartbeat_ok is None:
            return None
        return int((time.monotonic() - self.last_heartbeat_ok) * 1000)

    def _update(self, body: dict, answered_at: Optional[float] = None) -> None:
        self.last_heartbeat_ok = time.monotonic() if answered_at is None else answered_at
        self.broker_epoch = body["broker_epoch"]
        self.is_fenced = body["fenced"]
        self.in_controlled_shutdown = body.get("in_controlled_shutdown", False)
        self.should_shutdown = body.get("should_shutdown", False)
        self.last_heartbeat = body
        self._state_changed.set()
        self._state_changed = asyncio.Event()

    def _build_log_reports(self) -> Optional[list]:
        if self.log_reports_fn is None:
            return None
        try:
            return self.log_reports_fn()
        except Exception as exc:  # no report delays recovery; the heartbeat must go on
            log.warning("cannot build log reports for unclean recovery: %r", exc)
            return None

    def apply_heartbeat_answer(self, body: dict, answered_at: float) -> None:
        """On the loop: a heartbeat thread's answer (ignored when it is about an older
        registration than ours); then the reports for its next heartbeat."""
        if body.get("broker_epoch") != self.broker_epoch:
            return
        self._update(body, answered_at)
        self.pending_log_reports = self._build_log_reports() or []

    def reregister_soon(self, stale_epoch: int) -> None:
        """On the loop: the heartbeat thread was told our registration `stale_epoch` is stale;
        register again (once, unless that already happened)."""
        if self.broker_epoch != stale_epoch or (self._reregistering is not None and not self._reregistering.done()):
            return

        async def again() -> None:
            try:
                await self.heartbeat_once(want_shutdown=self.in_controlled_shutdown)
            except Exception as exc:   # the thread's next heartbeat tells us again
                log.info("registering again failed: %s", exc)
        self._reregistering = asyncio.get_running_loop().create_task(again())

    async def heartbeat_once(self, want_shutdown: bool = False) -> dict:
        if self.broker_epoch is None:
            await self.register()
        reports = self._build_log_reports()
        try:
            body = await self.client.heartbeat(self.broker_id, self.broker_epoch, self._metadata_offset(),
                                               want_shutdown=want_shutdown, log_reports=reports,
                                               timeout_ms=self.session_timeout_ms)
        except KraftlogError as exc:
            if exc.code is ErrorCode.STALE_BROKER_EPOCH:
                # our registration was lost or replaced: register again (same incarnation)
                await self.register()
                body = await self.client.heartbeat(self.broker_id, self.broker_epoch, self._metadata_offset(),
                                                   want_shutdown=want_shutdown, log_reports=reports)
            else:
                raise
        if self.client.active_url != self._heartbeat_controller:
            self._heartbeat_controller = self.client.active_url
            log.info("heartbeat answered by the active controller %s", self._heartbeat_controller)
        self._update(body)
        return body

    async def start(self, *, heartbeat_thread: Any = None) -> None:
        """Register, then heartbeat in the background: from a task of this loop, or from
        `heartbeat_thread` (a `metadata_quorum.heartbeat_thread.BrokerHeartbeatThread` built
        on this lifecycle: heartbeats from a thread of their own, `start()`ed here and
        `stop()`ped by `stop()`)."""
        await self.register()
        if heartbeat_thread is not None:
            self._heartbeat_thread = heartbeat_thread
            heartbeat_thread.start()
        else:
            self._task = asyncio.get_running_loop().create_task(self._heartbeat_loop())

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep((self.heartbeat_interval_ms or 2000) / 1000)
            if self._paused:
                continue
            try:
                await self.heartbeat_once(want_shutdown=self.in_controlled_shutdown)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.info("heartbeat failed: %s", exc)

    def pause_heartbeats(self, paused: bool = True) -> None:
        """Stop/restart heartbeating (tests and maintenance)."""
        self._paused = paused

    async def wait_until(self, predicate: Callable[["BrokerLifecycle"], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not predicate(self):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            try:
                await asyncio.wait_for(self._state_changed.wait(), remaining)
            except asyncio.TimeoutError:
                return predicate(self)
        return True

    async def wait_unfenced(self, timeout: float) -> bool:
        return await self.wait_until(lambda s: not s.is_fenced, timeout)

    async def controlled_shutdown(self, timeout: float) -> bool:
        """Ask the controller to move leaderships away; True once it says we may stop."""
        deadline = time.monotonic() + timeout
        self.in_controlled_shutdown = True
        while time.monotonic() < deadline:
            try:
                body = await self.heartbeat_once(want_shutdown=True)
                if body.get("should_shutdown"):
                    await self.stop()
                    return True
            except KraftlogError as exc:
                log.info("controlled shutdown heartbeat failed: %s", exc)
            await asyncio.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
        await self.stop()
        return False

    async def stop(self) -> None:
        if self._heartbeat_thread is not None:
            thread, self._heartbeat_thread = self._heartbeat_thread, None
            await asyncio.get_running_loop().run_in_executor(None, thread.stop)
        if self._reregistering is not None:
            self._reregistering.cancel()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
            self._task = None
