"""raft_timeline: stretches without a raft leader read from the controllers' INFO logs."""
from __future__ import annotations

from tests.chaos.raft_timeline import attach_faults, leaderless_stretches, parse_lines, summary


def _line(sec: float, node: int, text: str) -> str:
    whole, ms = int(sec), int(round((sec - int(sec)) * 1000))
    return f"2026-11-26 10:00:{whole:02d},{ms:03d} INFO raft.syncobj_log: raft node {node}: {text}\n"


LOG = [
    _line(1.0, 1, "term 1, no leader (leader None)"),      # the cluster's start: not a stretch
    _line(1.2, 1, "term 1, leader (leader 1)"),
    _line(1.21, 2, "term 1, follower (leader 1)"),
    _line(5.0, 2, "term 2, no leader (leader None)"),      # a follower campaigns while 1 is alive
    _line(5.1, 1, "term 2, no leader (leader None)"),      # the leader is deposed
    _line(5.9, 3, "term 3, no leader (leader None)"),      # split vote: another term
    _line(7.4, 3, "term 3, leader (leader 3)"),
    _line(7.5, 1, "term 3, follower (leader 3)"),
    "2026-11-26 10:00:08,000 WARNING raft.syncobj_log: raft node 2: the raft thread did not tick for 1135 ms "
    "(0 ms of it in garbage collections; the election timeout is 300-600 ms): ...\n",
    _line(9.0, 1, "term 2, no leader (leader None)"),      # a restarted node at an old term: not a stretch
    _line(20.0, 3, "term 3, no leader (leader None)"),     # the leader steps down (lost its followers)
    _line(20.5, 2, "term 4, leader (leader 2)"),
    _line(21.0, 3, "term 4, follower (leader 2)"),
    _line(30.0, 1, "term 5, no leader (leader None)"),     # 1 cut off campaigns alone: 2 still leads
    _line(30.5, 1, "term 6, no leader (leader None)"),
    _line(31.0, 3, "term 6, no leader (leader None)"),     # healed: its term deposes 2 (a majority past 4)
    _line(31.1, 1, "term 6, leader (leader 1)"),
]


def test_stretches_span_from_the_leader_stepping_down_or_a_majority_leaving_its_term_to_the_next_leader():
    events, gaps = parse_lines(LOG)
    stretches = leaderless_stretches(events)
    assert [(round(s.start % 60, 2), round(s.duration_s, 2), sorted(s.terms)) for s in stretches] == [
        (5.1, 2.3, [2, 3]), (20.0, 0.5, [3]), (31.0, 0.1, [6])]
    assert [(n, g) for _, n, g in gaps] == [(2, 1.135)]
    fig = summary(stretches, gaps)
    assert (fig["leaderless"], fig["leaderless_max_s"], fig["leaderless_over_1s"], fig["tick_gap_max_s"]) == \
        (3, 2.3, 1, 1.14)


def test_a_stretch_still_open_at_the_end_of_the_logs_ends_there_and_faults_are_named():
    events, _ = parse_lines(LOG[:5])
    [s] = leaderless_stretches(events, end_t=events[0][0] + 10.0)
    assert round(s.duration_s, 2) == 5.9
    attach_faults([s], [{"kind": "pause-controller", "start": 3.0, "end": 4.0},
                        {"kind": "isolate-host", "start": 8.0, "end": 9.0}], wall_t0=s.start - 8.4)
    assert s.fault == "isolate-host"
