"""Chaos writers follow a NOT_LEADER_OR_FOLLOWER answer's leader hint at once (KIP-951's
`leader_id`; issue 24: the writer of a moved partition spent up to one metadata look,
0.5 s, asking the old leader again). The hint has no epoch, so the recorded epoch stays
and every metadata answer overrides the hint: a stale hint never outranks the real leader."""
from __future__ import annotations

import json
from types import SimpleNamespace

from tests.chaos.harness.history import History
from tests.chaos.harness.workload import Workload


def _workload() -> Workload:
    w = Workload(SimpleNamespace(ids=[1, 2, 3]), History(), partitions=1)
    w.leaders[("chaos", 0)], w.leader_epochs[("chaos", 0)] = 1, 4
    return w


def _nlof(leader_id: int) -> bytes:
    return json.dumps({"error_code": "NOT_LEADER_OR_FOLLOWER", "message": "broker 1 is not the leader",
                       "leader_id": leader_id, "leader_url": f"http://b{leader_id}"}).encode()


def test_the_hint_is_followed_and_never_outranks_metadata():
    w = _workload()
    assert w._follow_hint(("chaos", 0), 421, _nlof(3))
    assert (w.leaders[("chaos", 0)], w.leader_epochs[("chaos", 0)]) == (3, 4)
    for stale_hint in (2, 1, 2, 1):          # brokers with stale views naming each other
        w._follow_hint(("chaos", 0), 421, _nlof(stale_hint))
    assert w.leader_epochs[("chaos", 0)] == 4
    real = {"topics": [{"name": "chaos", "partitions": [{"partition": 0, "leader": 3, "leader_epoch": 5}]}]}
    w._merge_metadata(real)
    assert (w.leaders[("chaos", 0)], w.leader_epochs[("chaos", 0)]) == (3, 5)


def test_no_hint_the_same_leader_or_another_error_changes_nothing():
    w = _workload()
    for body in (_nlof(-1), _nlof(1), _nlof(9), b"not json",
                 json.dumps({"error_code": "NOT_ENOUGH_REPLICAS", "leader_id": 2}).encode()):
        assert not w._follow_hint(("chaos", 0), 421, body)
    assert (w.leaders[("chaos", 0)], w.leader_epochs[("chaos", 0)]) == (1, 4)
