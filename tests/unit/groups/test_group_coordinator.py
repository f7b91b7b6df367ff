"""GroupCoordinatorState: join / heartbeat / leave / expiry, revocation before assignment,
member epochs fencing stale members, offsets, and replay of the written records."""
import random

import pytest

from partitions.groups import records as rec
from partitions.groups.coordinator import GroupConfig, GroupCoordinatorState, GroupError

T = {"t": 6}


class Log:
    """What the shell does: append every record, apply written offset commits."""

    def __init__(self):
        self.records = []

    def write(self, state, records, now, *, apply=False):
        first = len(self.records)
        self.records.extend(records)
        if apply:
            state.apply(records, first, now)
        return first


def new_state(**cfg):
    return GroupCoordinatorState(GroupConfig(**cfg), T)


def settle(st, group, members, now, rounds=6):
    """Heartbeat every member (reporting what it owns) until nothing changes."""
    owned = {m: frozenset() for m in members}
    epochs = {m: 0 for m in members}
    for m in members:
        res, _ = st.heartbeat(group, m, st.groups[group].members[m].member_epoch, now)
        owned[m], epochs[m] = res.assignment, res.member_epoch
    for _ in range(rounds):
        for m in members:
            res, _ = st.heartbeat(group, m, epochs[m], now, owned=owned[m])
            owned[m], epochs[m] = res.assignment, res.member_epoch
    return owned, epochs


def no_overlap(st, group):
    seen = set()
    for m in st.groups[group].members.values():
        assert not (m.owns() & seen), "a partition owned by two members"
        seen |= m.owns()


def test_three_members_share_six_partitions_without_overlap():
    st = new_state()
    for m in ("a", "b", "c"):
        st.join("g", m, ["t"], 0)
        no_overlap(st, "g")
    owned, epochs = settle(st, "g", ["a", "b", "c"], 10)
    assert sorted(len(v) for v in owned.values()) == [2, 2, 2]
    assert frozenset().union(*owned.values()) == {("t", p) for p in range(6)}
    assert st.groups["g"].state == "stable"
    assert set(epochs.values()) == {st.groups["g"].group_epoch}


def test_partitions_are_revoked_before_they_are_reassigned():
    st = new_state()
    res, _ = st.join("g", "a", ["t"], 0)
    assert len(res.assignment) == 6 and res.member_epoch == 1
    res_b, _ = st.join("g", "b", ["t"], 1)
    assert res_b.assignment == frozenset()      # a still owns everything
    res_a, recs = st.heartbeat("g", "a", 1, 2, owned=res.assignment)
    assert len(res_a.assignment) == 3 and res_a.member_epoch == 1 and recs  # revoking 3
    res_b, _ = st.heartbeat("g", "b", res_b.member_epoch, 3, owned=[])
    assert res_b.assignment == frozenset()      # not yet released
    no_overlap(st, "g")
    res_a2, _ = st.heartbeat("g", "a", 1, 4, owned=res_a.assignment)  # acknowledged
    assert res_a2.assignment == res_a.assignment and res_a2.member_epoch == 2
    res_b, _ = st.heartbeat("g", "b", res_b.member_epoch, 5, owned=[])
    assert len(res_b.assignment) == 3 and res_b.member_epoch == 2
    assert res_a2.assignment.isdisjoint(res_b.assignment)


def test_session_expiry_moves_partitions_to_the_others():
    st = new_state(session_timeout_ms=3000)
    for m in ("a", "b", "c"):
        st.join("g", m, ["t"], 0)
    owned, epochs = settle(st, "g", ["a", "b", "c"], 0)
    assert st.next_expiry_ms() == 3001
    # a and b keep heartbeating, c is silent
    for now in (1000, 2000, 3000):
        for m in ("a", "b"):
            res, _ = st.heartbeat("g", m, epochs[m], now, owned=owned[m])
            owned[m], epochs[m] = res.assignment, res.member_epoch
    assert st.expire(3000) == []
    removed = st.expire(3001)
    assert [(g, m) for g, m, _ in removed] == [("g", "c")] and removed[0][2]
    for _ in range(2):
        for m in ("a", "b"):
            res, _ = st.heartbeat("g", m, epochs[m], 3100, owned=owned[m])
            owned[m], epochs[m] = res.assignment, res.member_epoch
    assert owned["a"] | owned["b"] == {("t", p) for p in range(6)}
    with pytest.raises(GroupError) as e:
        st.heartbeat("g", "c", epochs["c"], 3200)
    assert e.value.code == "UNKNOWN_MEMBER_ID"


def test_member_that_does_not_revoke_in_time_is_removed():
    st = new_state(rebalance_timeout_ms=500)
    res, _ = st.join("g", "a", ["t"], 0)
    st.join("g", "b", ["t"], 0)
    st.heartbeat("g", "a", 1, 10, owned=res.assignment)        # told to revoke
    st.heartbeat("g", "a", 1, 400, owned=res.assignment)       # still holding them
    st.heartbeat("g", "b", st.groups["g"].members["b"].member_epoch, 400, owned=[])
    assert [m for _, m, _ in st.expire(600)] == ["a"]


def test_leave_and_session_timeout_limits():
    st = new_state(group_min_session_timeout_ms=1000, group_max_session_timeout_ms=5000)
    with pytest.raises(GroupError) as e:
        st.join("g", "a", ["t"], 0, session_timeout_ms=999)
    assert e.value.code == "INVALID_SESSION_TIMEOUT"
    with pytest.raises(GroupError):
        st.join("g", "a", ["t"], 0, session_timeout_ms=5001)
    res, _ = st.join("g", "a", ["t"], 0, session_timeout_ms=1000)
    assert res.session_timeout_ms == 1000 and res.heartbeat_interval_ms == 333
    recs = st.leave("g", "a", 5)
    assert recs and st.groups["g"].state == "empty"


def test_stale_heartbeat_epochs_are_fenced():
    st = new_state()
    res, _ = st.join("g", "a", ["t"], 0)
    with pytest.raises(GroupError) as e:
        st.heartbeat("g", "a", res.member_epoch + 1, 1)
    assert e.value.code == "FENCED_MEMBER_EPOCH"
    # an older epoch with partitions it still owns is a lost answer, not a zombie
    st.join("g", "b", ["t"], 1)
    r1, _ = st.heartbeat("g", "a", 1, 2, owned=res.assignment)
    r2, _ = st.heartbeat("g", "a", 1, 3, owned=r1.assignment)
    assert r2.member_epoch == 2
    st.heartbeat("g", "a", 1, 4, owned=r2.assignment)
    with pytest.raises(GroupError) as e:
        st.heartbeat("g", "a", 1, 5, owned=res.assignment)   # claims partitions no longer its own
    assert e.value.code == "FENCED_MEMBER_EPOCH"


def test_commit_fencing():
    st = new_state()
    log = Log()
    res, _ = st.join("g", "a", ["t"], 0)
    # no member id while the group has members: refused
    with pytest.raises(GroupError) as e:
        st.prepare_commit("g", [("t", 0, 5)], 1)
    assert e.value.code == "UNKNOWN_MEMBER_ID"
    log.write(st, st.prepare_commit("g", [("t", 0, 5)], 1, member_id="a", member_epoch=1), 1, apply=True)
    st.join("g", "b", ["t"], 2)
    r, _ = st.heartbeat("g", "a", 1, 3, owned=res.assignment)
    revoked = res.assignment - r.assignment
    tp = sorted(revoked)[0]
    # while revoking, a may still commit what it is giving up
    log.write(st, st.prepare_commit("g", [(*tp, 7)], 4, member_id="a", member_epoch=1), 4, apply=True)
    st.heartbeat("g", "a", 1, 5, owned=r.assignment)                          # released
    with pytest.raises(GroupError) as e:
        st.prepare_commit("g", [(*tp, 3)], 6, member_id="a", member_epoch=1)   # a zombie commit
    assert e.value.code == "ILLEGAL_GENERATION"
    with pytest.raises(GroupError) as e:
        st.prepare_commit("g", [("t", 0, 1)], 6, member_id="a", member_epoch=99)
    assert e.value.code == "FENCED_MEMBER_EPOCH"
    with pytest.raises(GroupError) as e:
        st.prepare_commit("g", [("t", 0, 1)], 6, member_id="zz", member_epoch=1)
    assert e.value.code == "UNKNOWN_MEMBER_ID"
    assert dict(((t, p), o.offset) for t, p, o in st.fetch_offsets("g"))[tp] == 7


def test_offsets_cache_takes_the_latest_record():
    st = new_state()
    recs1 = st.prepare_commit("g", [("t", 1, 10)], 1)
    recs2 = st.prepare_commit("g", [("t", 1, 20)], 2)
    st.apply(recs2, 6, 2)
    st.apply(recs1, 5, 2)   # written first, acknowledged last: must not win
    assert [(t, p, o.offset) for t, p, o in st.fetch_offsets("g")] == [("t", 1, 20)]
    st.apply([(rec.offset_key("g", "t", 1), None)], 7, 3)
    assert st.fetch_offsets("g") == []


def test_encoding_is_deterministic():
    a = rec.group_value({"b": 1, "a": [1, 2]})
    assert a == rec.group_value({"a": [1, 2], "b": 1}) == b'{"a":[1,2],"b":1,"v":1}'
    assert rec.offset_key("g", "t", 1) == b'{"group":"g","partition":1,"topic":"t","type":"offset","v":1}'
    assert rec.partition_for_group("g", 10) == rec.partition_for_group("g", 10) < 10


def test_read_barrier_records_have_one_key_and_replay_skips_them():
    assert rec.barrier_key() == rec.barrier_key() == b'{"type":"barrier","v":1}'   # compaction keeps one
    st = new_state()
    recs = st.prepare_commit("g", [("t", 0, 5)], 1)
    st.apply(recs, 0, 1)
    fresh = new_state()
    log = recs + [(rec.barrier_key(), rec.barrier_value(1, 3))]
    for i, (k, v) in enumerate(log):
        fresh.replay(k, v, i, 1)
    assert fresh.groups == st.groups and fresh.offsets == st.offsets


@pytest.mark.parametrize("seed", range(20))
def test_replay_rebuilds_the_same_state(seed):
    """Random joins / heartbeats / leaves / expiries / commits; replaying every written record
    into a fresh state gives the same groups and offsets, and no partition is ever doubly owned."""
    rnd = random.Random(seed)
    st = GroupCoordinatorState(GroupConfig(session_timeout_ms=2000), {"t": 6, "u": 3})
    log = Log()
    now = 0
    owned, epochs = {}, {}
    for step in range(200):
        now += rnd.randint(1, 300)
        g = rnd.choice(["g1", "g2"])
        op = rnd.random()
        members = [m for (gg, m) in owned if gg == g]
        try:
            if op < 0.15 or not members:
                m = f"m{rnd.randint(0, 5)}"
                res, recs = st.join(g, m, rnd.choice([["t"], ["t", "u"], ["u"]]), now,
                                    assignor=None if g in st.groups else rnd.choice(["range", "sticky"]))
                owned[(g, m)], epochs[(g, m)] = res.assignment, res.member_epoch
            elif op < 0.2:
                m = rnd.choice(members)
                recs = st.leave(g, m, now)
                owned.pop((g, m)), epochs.pop((g, m))
            elif op < 0.3:
                m = rnd.choice(members)
                tps = sorted(owned[(g, m)])
                recs = []
                if tps:
                    recs = st.prepare_commit(g, [(*tp, rnd.randint(0, 100)) for tp in tps], now,
                                             member_id=m, member_epoch=epochs[(g, m)])
                log.write(st, recs, now, apply=True)
                continue
            else:
                m = rnd.choice(members)
                res, recs = st.heartbeat(g, m, epochs[(g, m)], now, owned=owned[(g, m)])
                owned[(g, m)], epochs[(g, m)] = res.assignment, res.member_epoch
        except GroupError as e:
            assert e.code in ("UNKNOWN_MEMBER_ID", "FENCED_MEMBER_EPOCH"), e
            owned.pop((g, m), None), epochs.pop((g, m), None)
            continue
        log.write(st, recs, now)
        for gid, mid, recs in st.expire(now):
            owned.pop((gid, mid), None), epochs.pop((gid, mid), None)
            log.write(st, recs, now)
        for gid in st.groups:
            no_overlap(st, gid)
    fresh = GroupCoordinatorState(GroupConfig(session_timeout_ms=2000), {"t": 6, "u": 3})
    for i, (k, v) in enumerate(log.records):
        fresh.replay(k, v, i, now)
    assert {g: x.to_dict() for g, x in fresh.groups.items()} == {g: x.to_dict() for g, x in st.groups.items()}
    assert fresh.fetch_offsets("g1") == st.fetch_offsets("g1")
    assert fresh.fetch_offsets("g2") == st.fetch_offsets("g2")


def test_load_with_changed_topics_recomputes_targets():
    st = GroupCoordinatorState(GroupConfig(), {"t": 2})
    _, recs = st.join("g", "a", ["t"], 0)
    fresh = GroupCoordinatorState(GroupConfig(), {"t": 4})   # two partitions added meanwhile
    for i, (k, v) in enumerate(recs):
        fresh.replay(k, v, i, 0)
    assert fresh.refresh_targets(1)
    res, _ = fresh.heartbeat("g", "a", 1, 2, owned=[("t", 0), ("t", 1)])
    assert res.assignment == {("t", p) for p in range(4)}
    assert fresh.refresh_targets(3) == []          # nothing more to do
    same = GroupCoordinatorState(GroupConfig(), {"t": 2})
    for i, (k, v) in enumerate(recs):
        same.replay(k, v, i, 0)
    assert same.refresh_targets(1) == []


def test_delete_group_only_when_empty_and_replay_forgets_it():
    st = new_state()
    log = Log()
    _, recs = st.join("g", "a", ["t"], 0)
    log.write(st, recs, 0)
    log.write(st, st.prepare_commit("g", [("t", 0, 3)], 1, member_id="a"), 1, apply=True)
    with pytest.raises(GroupError) as e:
        st.delete_group("g")
    assert e.value.code == "NON_EMPTY_GROUP"
    log.write(st, st.leave("g", "a", 2), 2)
    log.write(st, st.delete_group("g"), 3, apply=True)
    assert "g" not in st.groups and st.fetch_offsets("g") == []
    with pytest.raises(GroupError) as e:
        st.delete_group("g")
    assert e.value.code == "GROUP_ID_NOT_FOUND"
    fresh = new_state()
    for i, (k, v) in enumerate(log.records):
        fresh.replay(k, v, i, 5)
    assert fresh.groups == {} and fresh.offsets == {}


# ---- offsets retention (offsets.retention.minutes) ------------------------------------

DAY = 86_400_000


def _write(st: GroupCoordinatorState, records: list, log: list) -> None:
    """Append records to a fake log and apply them, as the shell does after acks=all."""
    st.apply(records, len(log), 0)
    log.extend(records)


def test_offsets_of_a_group_with_members_never_expire():
    st = GroupCoordinatorState(topics={"t": 2})
    log: list = []
    res, recs = st.join("g", "m1", ["t"], 0)
    log += recs
    assert res.assignment == {("t", 0), ("t", 1)}
    _write(st, st.prepare_commit("g", [("t", p, 5) for _, p in sorted(res.assignment)], 0, member_id="m1"), log)
    st.heartbeat("g", "m1", res.member_epoch, 100 * DAY)    # alive
    assert len(st.fetch_offsets("g")) == 2
    assert st.expire_offsets(100 * DAY, 7 * DAY) == []


def test_retention_counts_from_when_the_group_became_empty():
    st = GroupCoordinatorState(topics={"t": 1})
    log: list = []
    res, recs = st.join("g", "m1", ["t"], 0)
    log += recs
    _write(st, st.prepare_commit("g", [("t", 0, 9)], 0, member_id="m1"), log)
    log += st.leave("g", "m1", 3 * DAY)                        # empty since day 3, commit from day 0
    assert st.expire_offsets(3 * DAY + 7 * DAY - 1, 7 * DAY) == []
    out = st.expire_offsets(10 * DAY, 7 * DAY)
    assert sorted(k for k, _ in out) == sorted([rec.offset_key("g", "t", 0), rec.group_key("g")])
    assert all(v is None for _, v in out)
    _write(st, out, log)
    assert st.fetch_offsets("g") == [] and st.list_groups() == []
    # a new coordinator replaying the log agrees
    st2 = GroupCoordinatorState(topics={"t": 1})
    for i, (k, v) in enumerate(log):
        st2.replay(k, v, i, 11 * DAY)
    assert st2.fetch_offsets("g") == [] and st2.list_groups() == []


def test_standalone_commits_expire_one_by_one_by_commit_time():
    st = GroupCoordinatorState(topics={"t": 2})
    log: list = []
    _write(st, st.prepare_commit("s", [("t", 0, 1)], 0), log)
    _write(st, st.prepare_commit("s", [("t", 1, 4)], 5 * DAY), log)
    out = st.expire_offsets(8 * DAY, 7 * DAY)
    assert out == [(rec.offset_key("s", "t", 0), None)]
    _write(st, out, log)
    assert [(t, p, om.offset) for t, p, om in st.fetch_offsets("s")] == [("t", 1, 4)]
    # a fresh commit restarts the clock of its partition
    _write(st, st.prepare_commit("s", [("t", 1, 6)], 11 * DAY), log)
    assert st.expire_offsets(13 * DAY, 7 * DAY) == []


def test_an_empty_group_without_offsets_is_forgotten_after_retention_and_the_record_replays():
    st = GroupCoordinatorState(topics={"t": 1})
    log: list = []
    _, recs = st.join("e", "m1", ["t"], 0)
    log += recs
    recs = st.leave("e", "m1", DAY)
    log += recs
    assert rec.decode_value(recs[-1][1])["empty_since_ms"] == DAY
    st2 = GroupCoordinatorState(topics={"t": 1})
    for i, (k, v) in enumerate(log):
        st2.replay(k, v, i, 2 * DAY)
    assert st2.groups["e"].empty_since_ms == DAY
    assert st2.expire_offsets(7 * DAY, 7 * DAY) == []
    assert st2.expire_offsets(8 * DAY, 7 * DAY) == [(rec.group_key("e"), None)]
    assert "e" not in st2.groups
    # rejoining resets the empty clock
    _, recs = st.join("e", "m2", ["t"], 2 * DAY)
    assert st.groups["e"].empty_since_ms == -1 and rec.decode_value(recs[-1][1])["empty_since_ms"] == -1
