"""Kafka's classic consumer group protocol (JoinGroup / SyncGroup / Heartbeat / LeaveGroup)
for Kafka clients, on the broker that coordinates the group (the leader of the group's
`__consumer_offsets` partition; committed offsets go through the existing coordinator).

The broker only runs the membership state machine; the group leader (a client) computes
the assignment, as in Kafka:

    Empty --join--> PreparingRebalance --every member joined or rebalance timeout-->
    CompletingRebalance --leader's SyncGroup--> Stable --join / leave / session expiry-->
    PreparingRebalance ...

Invariants: `generation` grows by one per completed join phase; a member is in `members`
from its first accepted join until it leaves or its session expires; answers of a join
phase name the generation, the chosen protocol (one every member supports, in the leader's
order of preference) and the leader, and only the leader gets the member list.
Membership lives in memory: when the coordinator moves, members find the new one, get
UNKNOWN_MEMBER_ID and join again (their committed offsets are durable).
"""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode as K

log = logging.getLogger("kraftlog.kafka.groups")

# a new group waits this long for more members before its first join phase completes
# (Kafka's group.initial.rebalance.delay.ms, shorter: local clusters start members together)
GROUP_INITIAL_REBALANCE_DELAY_MS = 300
SESSION_CHECK_INTERVAL_MS = 200

EMPTY, PREPARING, COMPLETING, STABLE = "Empty", "PreparingRebalance", "CompletingRebalance", "Stable"


class ClassicGroupError(Exception):
    """A refused group request, with Kafka's error code."""

    def __init__(self, code: K, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class Member:
    member_id: str
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    last_seen: float = 0.0
    assignment: bytes = b""


@dataclass
class Group:
    group_id: str
    state: str = EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    pending: set[str] = field(default_factory=set)      # ids handed out with MEMBER_ID_REQUIRED
    join_waiters: dict[str, asyncio.Future] = field(default_factory=dict)
    sync_waiters: dict[str, asyncio.Future] = field(default_factory=dict)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    completer: asyncio.Task | None = None


class ClassicGroups:
    """Classic-protocol groups coordinated by this broker (see the module docstring)."""

    def __init__(self, config) -> None:
        self.config = config
        self.groups: dict[str, Group] = {}
        self._expiry: asyncio.Task | None = None

    def start(self) -> None:
        self._expiry = asyncio.ensure_future(self._expiry_loop())

    async def stop(self) -> None:
        tasks = [t for t in [self._expiry] + [g.completer for g in self.groups.values()] if t is not None]
        for t in tasks:
            t.cancel()
        for t in tasks:
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass

    # ---- join ------------------------------------------------------------------------------

    async def join(self, req, header) -> dict:
        c = self.config
        session_ms = int(req.session_timeout.total_seconds() * 1000)
        rebalance = getattr(req, "rebalance_timeout", None)
        rebalance_ms = int(rebalance.total_seconds() * 1000) if rebalance is not None else session_ms
        if rebalance_ms <= 0:
            rebalance_ms = session_ms
        if not c.group_min_session_timeout_ms <= session_ms <= c.group_max_session_timeout_ms:
            raise ClassicGroupError(K.invalid_session_timeout,
                                    f"session timeout {session_ms} ms is outside [{c.group_min_session_timeout_ms}, "
                                    f"{c.group_max_session_timeout_ms}]")
        g = self.groups.setdefault(req.group_id, Group(req.group_id))
        protocols = [(p.name, bytes(p.metadata)) for p in req.protocols]
        if not protocols:
            raise ClassicGroupError(K.inconsistent_group_protocol, "a join must name at least one protocol")
        if g.members and g.protocol_type is not None and req.protocol_type != g.protocol_type:
            raise ClassicGroupError(K.inconsistent_group_protocol,
                                    f"group {g.group_id!r} uses protocol type {g.protocol_type!r}")
        member_id = req.member_id or ""
        if not member_id:
            member_id = f"{header.client_id or 'member'}-{uuid.uuid4()}"
            if header.api_version >= 4:   # KIP-394: hand out the id, the client joins again with it
                g.pending.add(member_id)
                return {"throttle_time": 0, "error_code": K.member_id_required, "generation_id": -1,
                        "protocol_type": None, "protocol_name": None, "leader": "", "member_id": member_id,
                        "members": ()}
        elif member_id not in g.members and member_id not in g.pending:
            raise ClassicGroupError(K.unknown_member_id, f"member {member_id!r} is not in group {g.group_id!r}; "
                                    "join with an empty member id")
        g.pending.discard(member_id)
        log.debug("group %s: join of %s in state %s generation %d", g.group_id, member_id, g.state, g.generation)
        m = g.members.get(member_id)
        if m is None:
            m = Member(member_id, header.client_id or "", "/127.0.0.1", session_ms, rebalance_ms,
                       req.protocol_type, protocols)
            g.members[member_id] = m
        else:
            m.session_timeout_ms, m.rebalance_timeout_ms, m.protocols = session_ms, rebalance_ms, protocols
        m.last_seen = time.monotonic()
        if g.protocol_type is None:
            g.protocol_type = req.protocol_type
        old = g.join_waiters.pop(member_id, None)
        if old is not None and not old.done():
            old.set_exception(ClassicGroupError(K.unknown_member_id, "superseded by a newer join of this member"))
        fut = asyncio.get_running_loop().create_future()
        g.join_waiters[member_id] = fut
        self._prepare_rebalance(g)
        g.changed.set()
        return await fut

    def _prepare_rebalance(self, g: Group) -> None:
        initial = g.state == EMPTY
        for f in g.sync_waiters.values():
            if not f.done():
                f.set_exception(ClassicGroupError(K.rebalance_in_progress, "the group is rebalancing; join again"))
        g.sync_waiters.clear()
        if g.state != PREPARING:
            g.state = PREPARING
        if g.completer is None or g.completer.done():
            g.completer = asyncio.ensure_future(self._complete_join(g, initial))

    async def _complete_join(self, g: Group, initial: bool) -> None:
        loop = asyncio.get_running_loop()
        if initial:
            await asyncio.sleep(GROUP_INITIAL_REBALANCE_DELAY_MS / 1000)
        timeout = max([m.rebalance_timeout_ms for m in g.members.values()] or [0]) / 1000
        deadline = loop.time() + timeout
        while set(g.members) - set(g.join_waiters) and loop.time() < deadline:
            g.changed.clear()
            try:
                await asyncio.wait_for(g.changed.wait(), max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                break
        for mid in set(g.members) - set(g.join_waiters):   # did not rejoin in time
            log.info("group %s: member %s did not rejoin within the rebalance timeout; removed", g.group_id, mid)
            del g.members[mid]
        if not g.members:
            g.state, g.leader_id, g.protocol_name = EMPTY, None, None
            g.generation += 1
            return
        g.generation += 1
        if g.leader_id not in g.members:
            g.leader_id = next(iter(g.join_waiters))
        leader = g.members[g.leader_id]
        common = set.intersection(*(set(n for n, _ in m.protocols) for m in g.members.values()))
        chosen = next((n for n, _ in leader.protocols if n in common), None)
        waiters, g.join_waiters = g.join_waiters, {}
        if chosen is None:
            g.state = EMPTY
            g.members.clear()
            for f in waiters.values():
                if not f.done():
                    f.set_exception(ClassicGroupError(K.inconsistent_group_protocol,
                                                      "the members share no assignment protocol"))
            return
        g.protocol_name = chosen
        g.state = COMPLETING
        log.info("group %s generation %d: members %s, leader %s, protocol %s", g.group_id, g.generation,
                 sorted(g.members), g.leader_id, chosen)
        now = time.monotonic()
        members = [{"member_id": m.member_id, "group_instance_id": None, "metadata": dict(m.protocols)[chosen]}
                   for m in g.members.values()]
        for mid, f in waiters.items():
            g.members[mid].last_seen = now
            if not f.done():
                f.set_result({"throttle_time": 0, "error_code": K.none, "generation_id": g.generation,
                              "protocol_type": g.protocol_type, "protocol_name": chosen, "leader": g.leader_id,
                              "member_id": mid, "members": members if mid == g.leader_id else ()})

    # ---- sync, heartbeat, leave ----------------------------------------------------------

    def _member(self, group_id: str, member_id: str, generation: int) -> tuple[Group, Member]:
        g = self.groups.get(group_id)
        log.debug("group %s: member %s generation %d (group: %s generation %s)", group_id, member_id, generation,
                  g.state if g else None, g.generation if g else None)
        m = g.members.get(member_id) if g is not None else None
        if g is None or m is None:
            raise ClassicGroupError(K.unknown_member_id, f"member {member_id!r} is not in group {group_id!r}")
        m.last_seen = time.monotonic()
        if generation != g.generation:
            raise ClassicGroupError(K.illegal_generation,
                                    f"generation {generation} is not the group's current {g.generation}; join again")
        return g, m

    async def sync(self, req) -> dict:
        g, m = self._member(req.group_id, req.member_id, int(req.generation_id))
        if g.state == PREPARING:
            raise ClassicGroupError(K.rebalance_in_progress, "the group is rebalancing; join again")
        if g.state == COMPLETING:
            if m.member_id == g.leader_id:
                given = {a.member_id: bytes(a.assignment) for a in req.assignments}
                for mid, mem in g.members.items():
                    mem.assignment = given.get(mid, b"")
                g.state = STABLE
                for mid, f in g.sync_waiters.items():
                    if not f.done():
                        f.set_result(g.members[mid].assignment if mid in g.members else b"")
                g.sync_waiters.clear()
            else:
                fut = asyncio.get_running_loop().create_future()
                g.sync_waiters[m.member_id] = fut
                await fut
        return {"throttle_time": 0, "error_code": K.none, "protocol_type": g.protocol_type,
                "protocol_name": g.protocol_name, "assignment": m.assignment}

    async def heartbeat(self, req) -> None:
        g, _m = self._member(req.group_id, req.member_id, int(req.generation_id))
        if g.state == PREPARING:
            raise ClassicGroupError(K.rebalance_in_progress, "the group is rebalancing; join again")

    async def leave(self, group_id: str, member_ids: list[str]) -> None:
        g = self.groups.get(group_id)
        if g is None or any(mid not in g.members for mid in member_ids):
            raise ClassicGroupError(K.unknown_member_id, f"not a member of group {group_id!r}")
        self._remove(g, member_ids)

    def _remove(self, g: Group, member_ids) -> None:
        for mid in member_ids:
            g.members.pop(mid, None)
            f = g.join_waiters.pop(mid, None)
            if f is not None and not f.done():
                f.set_exception(ClassicGroupError(K.unknown_member_id, "left the group"))
        if g.members:
            self._prepare_rebalance(g)
            g.changed.set()
        else:
            g.state, g.leader_id = EMPTY, None
            g.changed.set()

    def check_commit(self, group_id: str, member_id: str, generation: int) -> None:
        """OffsetCommit fencing: members of a group with members commit with their current
        generation; a group without members takes simple commits (generation -1)."""
        g = self.groups.get(group_id)
        if g is None or not g.members:
            if generation >= 0 and g is not None and member_id:
                raise ClassicGroupError(K.unknown_member_id, f"member {member_id!r} is not in group {group_id!r}")
            return
        if generation < 0 and not member_id:
            raise ClassicGroupError(K.unknown_member_id,
                                    f"group {group_id!r} has active members; commit as a member of it")
        g2, _m = self._member(group_id, member_id, generation)
        if g2.state == COMPLETING:
            raise ClassicGroupError(K.rebalance_in_progress, "the group is rebalancing; join again")

    async def _expiry_loop(self) -> None:
        while True:
            await asyncio.sleep(SESSION_CHECK_INTERVAL_MS / 1000)
            now = time.monotonic()
            for g in list(self.groups.values()):
                gone = [mid for mid, m in g.members.items()
                        if mid not in g.join_waiters and now - m.last_seen > m.session_timeout_ms / 1000]
                if gone:
                    self._remove(g, gone)

    # ---- describe ------------------------------------------------------------------------

    def listed(self) -> list[dict]:
        return [{"group_id": g.group_id, "protocol_type": g.protocol_type or "", "group_state": g.state}
                for g in self.groups.values()]

    def described(self, group_id: str) -> dict:
        g = self.groups.get(group_id)
        if g is None:
            return {"error_code": K.none, "group_id": group_id, "group_state": "Dead", "protocol_type": "",
                    "protocol_data": "", "members": ()}
        return {"error_code": K.none, "group_id": group_id, "group_state": g.state,
                "protocol_type": g.protocol_type or "", "protocol_data": g.protocol_name or "",
                "members": [{"member_id": m.member_id, "group_instance_id": None, "client_id": m.client_id,
                             "client_host": m.client_host,
                             "member_metadata": dict(m.protocols).get(g.protocol_name or "", b""),
                             "member_assignment": m.assignment} for m in g.members.values()]}
