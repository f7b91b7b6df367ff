"""The controller's quorum routes and membership loop (the IO shell of quorum_membership.py).

Routes (prefix /controller/v1, JSON):

    GET    /quorum[?require_active=true]  -> {"leader_id", "voters": [{"id", "address", "lag", "url", "state"}],
                                              "pending_change", "removed", "node_id"}
    GET    /quorum/identity               -> this controller's {"id", "raft_address", "url", "incarnation"}
    POST   /quorum/voters                 {id, raft_address, url, incarnation} -> 200 once the new voter is
                                          added and caught up ("caught_up": false after
                                          `voter_catch_up_timeout_ms`: start it, it catches up then)
    DELETE /quorum/voters/{id}            -> 200 once removed; on the active controller itself it
                                          transfers leadership first and answers 421 NOT_CONTROLLER
                                          (the client retries on the new active controller)

Refusals: a change in flight 400 POLICY_VIOLATION (reason voter_change_in_progress), the last
voter 400 POLICY_VIOLATION (reason last_voter), an id or address already a voter 409
DUPLICATE_VOTER, an unknown id 404 VOTER_NOT_FOUND, a removed incarnation 409 INVALID_VOTER_KEY.

At start, a controller with a new incarnation (an empty data directory) asks the other
controllers whether its id is a registered voter already and refuses to start if so.

The loop (every `quorum_tick_ms`, on every controller):
- registers this controller (id, raft address, URL, incarnation) through the raft leader when
  the replicated metadata does not have it (the voters the quorum was born with);
- stops this process when its registration names another incarnation (a wiped data
  directory) or says it was removed, and when a removal of this node is in flight and no
  leader has been heard for `removed_exit_after_ms` (a removed node is never told);
- names voters added at run time for leader_id / leader_url;
- on the active controller: finishes or aborts a change its predecessor left in flight.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import secrets
import signal
import time
from typing import Any, Awaitable, Callable, Optional
from urllib.parse import urlsplit

from aiohttp import web

from metadata_quorum import quorum_membership as qm
from partitions.errors import ErrorCode, KraftlogError
from raft.log import MembershipChangeError, NotLeaderError, OutcomeUnknownError

log = logging.getLogger("kraftlog.controller.quorum")

IDENTITY_FILE = "controller.identity"


def load_or_create_identity(data_dir: str, node_id: int) -> str:
    """This controller's incarnation id, made when its data directory holds none (a new or
    wiped node) and kept in DATA_DIR/controller.identity."""
    path = os.path.join(data_dir, IDENTITY_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        if doc.get("node_id") != node_id:
            raise SystemExit(f"{path} belongs to controller {doc.get('node_id')}, not {node_id}: this data directory "
                             "is another controller's; give each controller its own")
        return doc["incarnation"]
    except FileNotFoundError:
        pass
    incarnation = secrets.token_hex(8)
    os.makedirs(data_dir, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"node_id": node_id, "incarnation": incarnation}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return incarnation


def _stop_this_process(reason: str) -> None:
    log.error("stopping this controller: %s", reason)
    os.kill(os.getpid(), signal.SIGTERM)


class QuorumRoutes:
    """Quorum handlers and membership loop of one ControllerServer."""

    quorum_tick_ms = 250
    removed_exit_after_ms = 2000
    register_retry_ms = 2000
    voter_catch_up_timeout_ms = 30_000
    membership_commit_timeout_ms = 30_000

    def __init__(self, server: Any, json_body: Callable[[web.Request], Awaitable[dict]],
                 on_fatal: Callable[[str], None] = _stop_this_process) -> None:
        self.server = server
        self.sm = server.sm
        self.log = server.log
        self.config = server.config
        self._json_body = json_body
        self.on_fatal = on_fatal
        # membership needs the pysyncobj log (the in-memory test log has none of it)
        self.enabled = hasattr(self.log, "add_voter")
        fresh = not os.path.exists(os.path.join(self.config.data_dir, IDENTITY_FILE))
        self.incarnation = (load_or_create_identity(self.config.data_dir, self.config.node_id) if self.enabled
                            else secrets.token_hex(8))
        if self.enabled and fresh and len(self.config.voters) > 1:
            # a new incarnation: before raft starts (and could vote with an empty log), ask the
            # others whether this id is a registered voter already (a wiped data directory)
            problem = self._registered_elsewhere()
            if problem:
                raise SystemExit(problem)
        self._busy = False
        self._task: Optional[asyncio.Task] = None
        self._last_register = -1e9
        self._last_peer_check = -1e9
        self._stopping = False

    def install(self, app: web.Application, prefix: str) -> None:
        r = app.router
        r.add_get(prefix + "/quorum", self.h_describe)
        r.add_get(prefix + "/quorum/identity", self.h_identity)
        r.add_post(prefix + "/quorum/voters", self.h_add)
        r.add_delete(prefix + "/quorum/voters/{id}", self.h_remove)
        if self.enabled:
            app.on_startup.append(self._start)
            app.on_cleanup.append(self._stop)

    # ------------------------------------------------------------------ views
    @property
    def me(self) -> dict:
        v = self.config.voters[self.config.node_id]
        return {"id": self.config.node_id, "raft_address": v.raft_address, "url": v.url,
                "incarnation": self.incarnation}

    def _config_voters(self) -> dict:
        return {nid: v.raft_address for nid, v in self.config.voters.items()}

    def _voter_addresses(self) -> list:
        return self.log.voter_addresses() if self.enabled else [self.me["raft_address"]]

    def describe(self) -> dict:
        with self.sm.lock:
            doc = qm.describe(self.sm.controllers, self.sm.quorum_change, self._voter_addresses(),
                              self._config_voters(), self.log.leader_id,
                              self.log.match_indexes() if self.enabled else {},
                              self.log.commit_index if self.enabled else 0)
        doc["node_id"] = self.config.node_id
        return doc

    # ------------------------------------------------------------------ handlers
    async def h_describe(self, request: web.Request) -> web.Response:
        if request.query.get("require_active", "false").lower() in ("1", "true"):
            self.server._require_active()
        return web.json_response(self.describe())

    async def h_identity(self, request: web.Request) -> web.Response:
        return web.json_response({**self.me, "waiting_to_join": self.enabled and self.log.waiting_to_join})

    async def h_add(self, request: web.Request) -> web.Response:
        reg = qm.registration_from_body(await self._json_body(request))
        self._require_change_allowed()
        nid, addr = reg["id"], reg["raft_address"]
        with self.sm.lock:
            qm.decide_add(self.sm.controllers, self.sm.quorum_change, self._voter_addresses(),
                          self._config_voters(), reg)
        self._busy = True
        try:
            await self._propose({"op": "begin_add", "registration": reg})
            self._name_voters()
            try:
                await self.log.add_voter(addr, timeout_s=self.membership_commit_timeout_ms / 1000)
            except MembershipChangeError as exc:
                await self._propose({"op": "abort", "id": nid})
                raise self._refused(exc) from None
            except (NotLeaderError, OutcomeUnknownError) as exc:
                raise self._unknown(f"adding controller {nid}", exc) from None
            caught_up = await self._wait_caught_up(addr, self.voter_catch_up_timeout_ms / 1000)
            await self._propose({"op": "end_add", "id": nid})
        finally:
            self._busy = False
        log.info("controller %s (%s, incarnation %s) added to the metadata quorum%s", nid, addr,
                 reg["incarnation"], "" if caught_up else " (not caught up yet)")
        return web.json_response({**self.describe(), "added": nid, "caught_up": caught_up})

    async def h_remove(self, request: web.Request) -> web.Response:
        try:
            nid = int(request.match_info["id"])
        except ValueError:
            raise KraftlogError(ErrorCode.INVALID_REQUEST, f"controller id must be an integer, got "
                                f"{request.match_info['id']!r}") from None
        self._require_change_allowed()
        with self.sm.lock:
            addr = qm.decide_remove(self.sm.controllers, self.sm.quorum_change, self._voter_addresses(),
                                    self._config_voters(), nid, self.config.node_id)
        if nid == self.config.node_id:
            await self._hand_over()
        self._busy = True
        try:
            await self._propose({"op": "begin_remove", "id": nid, "raft_address": addr})
            # let the node see that it is being removed (it is never told afterwards)
            await self._wait_caught_up(addr, 3.0, settle_s=0.2)
            try:
                await self.log.remove_voter(addr, timeout_s=self.membership_commit_timeout_ms / 1000)
            except MembershipChangeError as exc:
                await self._propose({"op": "abort", "id": nid})
                raise self._refused(exc) from None
            except (NotLeaderError, OutcomeUnknownError) as exc:
                raise self._unknown(f"removing controller {nid}", exc) from None
            await self._propose({"op": "end_remove", "id": nid})
        finally:
            self._busy = False
        log.info("controller %s (%s) removed from the metadata quorum", nid, addr)
        return web.json_response({**self.describe(), "removed_id": nid})

    # ------------------------------------------------------------------ helpers
    def _require_change_allowed(self) -> None:
        if not self.enabled:
            raise KraftlogError(ErrorCode.INVALID_REQUEST, "this controller's raft log has no membership changes")
        self.server._require_active()
        if self._busy:
            with self.sm.lock:
                change = self.sm.quorum_change
            raise qm._in_progress(change or {"op": "add", "id": "?"})

    async def _hand_over(self) -> None:
        """The active controller cannot remove itself: make another caught-up voter leader,
        then answer NOT_CONTROLLER so the client asks it."""
        deadline = time.monotonic() + 5.0
        while self.log.is_leader and time.monotonic() < deadline:
            try:
                await self.log.transfer_leadership(None, timeout_s=1.0)
            except (NotLeaderError, OutcomeUnknownError, MembershipChangeError) as exc:
                log.info("leadership transfer not started yet: %s", exc)
            waited = time.monotonic() + 1.0
            while self.log.is_leader and time.monotonic() < waited:
                await asyncio.sleep(0.05)
        if self.log.is_leader:
            raise KraftlogError(ErrorCode.REQUEST_TIMED_OUT,
                                "no other voter caught up to take over from the active controller within 5 s; retry")
        log.info("handed leadership over before removing this controller (%s)", self.config.node_id)
        raise self.server._not_controller()

    async def _propose(self, op: dict) -> dict:
        entry = {"request_id": None, "controller_epoch": self.sm.image.controller_epoch, "quorum": op}
        try:
            result = (await self.log.propose([entry], timeout_s=self.config.propose_timeout_ms / 1000))[0]
        except NotLeaderError:
            raise self.server._not_controller() from None
        except OutcomeUnknownError as exc:
            raise self._unknown(f"quorum op {op['op']}", exc) from None
        if result.get("ok"):
            return result
        if result.get("stale_epoch"):
            raise self.server._not_controller()
        if result.get("in_flight"):
            raise qm._in_progress(result["in_flight"])
        raise KraftlogError(ErrorCode.INVALID_REQUEST, f"quorum op {op['op']} refused: {result.get('reason')}")

    @staticmethod
    def _unknown(what: str, exc: Exception) -> KraftlogError:
        return KraftlogError(ErrorCode.REQUEST_TIMED_OUT,
                             f"{what}: outcome unknown ({exc}); the active controller finishes or undoes it, "
                             "see kraftlog quorum describe")

    @staticmethod
    def _refused(exc: Exception) -> KraftlogError:
        return KraftlogError(ErrorCode.POLICY_VIOLATION, f"{exc}; one change at a time: retry once "
                             "kraftlog quorum describe shows no pending change", reason="voter_change_in_progress")

    async def _wait_caught_up(self, addr: str, timeout_s: float, settle_s: float = 0.0) -> bool:
        """Until the voter at `addr` holds every entry committed now (then `settle_s` more, for
        it to learn they are committed), at most `timeout_s`."""
        target = self.log.commit_index
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.log.match_indexes().get(addr, 0) >= target:
                if settle_s:
                    await asyncio.sleep(settle_s)
                return True
            if not self.log.is_leader:
                return False
            await asyncio.sleep(0.05)
        return False

    def _name_voters(self) -> None:
        """Make voters added at run time known by id (leader_id) and URL (leader_url)."""
        with self.sm.lock:
            regs = [dict(c) for c in self.sm.controllers.values() if c["state"] != "removed" and c.get("url")]
        for reg in regs:
            self.log.set_node_id(reg["id"], reg["raft_address"])
            if reg["id"] not in self.config.voters:
                url = urlsplit(reg["url"])
                host, port = reg["raft_address"].rsplit(":", 1)
                self.config.voters[reg["id"]] = dataclasses.replace(   # a controller_server.Voter
                    self.config.voters[self.config.node_id], node_id=reg["id"], host=url.hostname or host,
                    raft_port=int(port), http_port=url.port or (443 if url.scheme == "https" else 80),
                    scheme=url.scheme)

    # ------------------------------------------------------------------ loop
    async def _start(self, app: web.Application) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def _stop(self, app: web.Application) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.quorum_tick_ms / 1000)
            try:
                await self.tick()
            except KraftlogError as exc:
                log.info("quorum maintenance: %s", exc)
            except Exception:
                log.exception("quorum maintenance failed")

    def _fatal(self, reason: str) -> None:
        if not self._stopping:
            self._stopping = True
            self.on_fatal(reason)

    async def tick(self) -> None:
        if self._stopping:
            return
        self._name_voters()
        me = self.config.node_id
        with self.sm.lock:
            problem = qm.own_registration_problem(self.sm.controllers, me, self.incarnation)
            mine = self.sm.controllers.get(me)
            change = dict(self.sm.quorum_change) if self.sm.quorum_change else None
        if problem:
            self._fatal(problem)
            return
        now = time.monotonic()
        being_removed = change is not None and change["op"] == "remove" and change["id"] == me
        if self.log.leader_silence_s() * 1000 >= self.removed_exit_after_ms:
            if being_removed:
                self._fatal(f"controller {me} is being removed from the metadata quorum and no leader has "
                            f"talked to it for {self.removed_exit_after_ms} ms: it was removed")
                return
            if now - self._last_peer_check >= self.register_retry_ms / 1000:
                # it may have been cut off before it saw the removal begin: ask the others
                self._last_peer_check = now
                verdict = await asyncio.to_thread(self._removed_say_peers)
                if verdict:
                    self._fatal(verdict)
                    return
        if (mine is None and self.log.ready and self.log.leader_id is not None and not self.log.waiting_to_join
                and now - self._last_register >= self.register_retry_ms / 1000):
            self._last_register = now
            await self._register()
        if self.server.is_active and not self._busy:
            with self.sm.lock:
                op = qm.reconcile(self.sm.quorum_change, self.sm.controllers, self._voter_addresses(),
                                  self.sm.image.controller_epoch)
            if op is not None:
                log.info("finishing the quorum change left by the previous active controller: %s", op)
                await self._propose(op)

    def _registered_elsewhere(self) -> Optional[str]:
        """Why this fresh incarnation must not start, if a reachable plain-HTTP peer lists this
        id as a registered voter (with another incarnation, necessarily)."""
        import urllib.request

        me = self.config.node_id
        for nid, voter in list(self.config.voters.items()):
            if nid == me or not voter.url.startswith("http://"):
                continue
            try:
                with urllib.request.urlopen(voter.url + "/controller/v1/quorum", timeout=1.0) as resp:
                    doc = json.loads(resp.read())
            except (OSError, ValueError):
                continue
            for v in doc.get("voters", []):
                if v.get("id") == me and v.get("incarnation") and v["incarnation"] != self.incarnation:
                    controllers = {me: {"incarnation": v["incarnation"], "state": "voter"}}
                    return qm.own_registration_problem(controllers, me, self.incarnation)
        return None

    def _removed_say_peers(self) -> Optional[str]:
        """(Thread) Why this node was removed, if another controller with a leader says so
        (plain-HTTP peers only: a TLS peer is not asked)."""
        import urllib.request

        me = self.config.node_id
        for nid, voter in list(self.config.voters.items()):
            if nid == me or not voter.url.startswith("http://"):
                continue
            try:
                with urllib.request.urlopen(voter.url + "/controller/v1/quorum", timeout=1.0) as resp:
                    doc = json.loads(resp.read())
            except (OSError, ValueError):
                continue
            ids = [v.get("id") for v in doc.get("voters", [])]
            if doc.get("leader_id") is not None and me not in ids and me in doc.get("removed", []):
                return (f"controller {nid} says controller {me} was removed from the metadata quorum "
                        f"(voters {ids}); it stops")
        return None

    async def _register(self) -> None:
        entry = {"request_id": None, "controller_epoch": 0,
                 "quorum": {"op": "register", "registration": qm.registration(**{
                     "node_id": self.config.node_id, "raft_address": self.me["raft_address"],
                     "url": self.me["url"], "incarnation": self.incarnation})}}
        try:
            result = (await self.log.forward([entry], timeout_s=self.config.propose_timeout_ms / 1000))[0]
        except (NotLeaderError, OutcomeUnknownError) as exc:
            log.info("registering controller %s in the quorum: %s (retried)", self.config.node_id, exc)
            return
        if result.get("conflict"):
            log.error("controller %s: the quorum registered incarnation %s, this data directory holds %s",
                      self.config.node_id, result.get("registered"), self.incarnation)
        elif result.get("ok") and not result.get("noop"):
            log.info("controller %s registered in the quorum (incarnation %s)", self.config.node_id, self.incarnation)
