"""Raft leadership in a chaos run, read from the controllers' INFO logs (issue 24): the
stretches with no raft leader, the raft threads' tick gaps, and the fault (if any) each
stretch overlapped.

    python -m tests.chaos.raft_timeline DATA_DIR [--report REPORT_DIR] [--json]

DATA_DIR is the run's `--data-dir` (node-<i>/controller.log, written with `--log-level INFO`),
REPORT_DIR its `--report` (report.json: the faults and, since 3e4e85d's successor, the wall
clock of the history's time 0, so stretches are matched to faults).

A stretch opens when the leader says it stepped down or a majority of the controllers has
moved to a newer term (a controller campaigning alone, cut off, deposes nobody), and closes
when a controller leads a term no majority has left. So it is measured from the moment the
others noticed: the time before that (a stopped leader not yet missed) is not in it.
"""
from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import re
import statistics
from dataclasses import dataclass, field
from typing import Iterable, Optional

_RAFT = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \w+ raft\.syncobj_log: raft node (\d+): "
                   r"(?:term (\d+), (leader|follower|no leader)|the raft thread did not tick for (\d+) ms)")


@dataclass
class Stretch:
    """A time without a raft leader (wall-clock seconds); `terms`: the terms it went through."""

    start: float
    end: Optional[float] = None
    terms: set = field(default_factory=set)
    fault: Optional[str] = None   # the fault kind whose span it overlapped, if any

    @property
    def duration_s(self) -> float:
        return (self.end or self.start) - self.start


def _wall(stamp: str) -> float:
    return datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def parse_lines(lines: Iterable[str]) -> tuple[list, list]:
    """-> (role events (t, node, term, state), tick gaps (t, node, gap_s)) of one or more logs."""
    events, gaps = [], []
    for line in lines:
        m = _RAFT.match(line)
        if not m:
            continue
        t, node = _wall(m.group(1)), int(m.group(2))
        if m.group(5) is not None:
            gaps.append((t, node, int(m.group(5)) / 1000))
        else:
            events.append((t, node, int(m.group(3)), m.group(4)))
    return events, gaps


def leaderless_stretches(events: list, end_t: Optional[float] = None) -> list:
    """Stretches without a working raft leader from the role events of every controller (any
    order). A node that last said it leads term T leads until it says otherwise or a majority
    of the controllers has moved past T (a node campaigning alone, cut off from the others,
    deposes nobody). The cluster's start (before the first leader) is not a stretch."""
    nodes = {e[1] for e in events}
    majority = len(nodes) // 2 + 1
    state: dict = {}                 # node -> (term, role) as last logged
    out: list = []
    open_: Optional[Stretch] = None
    seen_leader = False

    def has_leader() -> bool:
        for term, role in state.values():
            if role == "leader" and sum(1 for t, _ in state.values() if t > term) < majority:
                return True
        return False

    for t, node, term, role in sorted(events):
        state[node] = (term, role)
        if has_leader():
            seen_leader = True
            if open_ is not None:
                open_.end = t
                out.append(open_)
                open_ = None
        elif seen_leader:
            if open_ is None:
                open_ = Stretch(start=t)
            open_.terms.add(term)
    if open_ is not None and end_t is not None:
        open_.end = end_t
        out.append(open_)
    return out


def attach_faults(stretches: list, faults: list, wall_t0: float) -> None:
    """Name the fault whose span (start to end, history clock) each stretch overlaps."""
    for s in stretches:
        for f in faults:
            a, b = wall_t0 + f["start"], wall_t0 + (f.get("end") or f["start"])
            if s.start <= b and (s.end or s.start) >= a:
                s.fault = f["kind"]
                break


def summary(stretches: list, gaps: list) -> dict:
    d = [s.duration_s for s in stretches]
    g = [x[2] for x in gaps]
    quiet = [s.duration_s for s in stretches if s.fault is None]
    return {
        "leaderless": len(d), "leaderless_total_s": round(sum(d), 2), "leaderless_max_s": round(max(d, default=0), 2),
        "leaderless_median_s": round(statistics.median(d), 2) if d else 0.0,
        "leaderless_over_1s": sum(1 for x in d if x > 1.0),
        "leaderless_no_fault": len(quiet), "leaderless_no_fault_total_s": round(sum(quiet), 2),
        "leaderless_no_fault_max_s": round(max(quiet, default=0), 2),
        "tick_gaps": len(g), "tick_gaps_total_s": round(sum(g), 2), "tick_gap_max_s": round(max(g, default=0), 2),
        "elections": sum(len(s.terms) for s in stretches),
    }


def analyse(data_dir: str, report_dir: Optional[str] = None) -> tuple[dict, list]:
    lines: list = []
    for path in sorted(glob.glob(os.path.join(data_dir, "node-*", "controller.log"))):
        with open(path, errors="replace") as f:
            lines.extend(f)
    events, gaps = parse_lines(lines)
    end_t = max((e[0] for e in events), default=None)
    stretches = leaderless_stretches(events, end_t)
    if report_dir and os.path.exists(os.path.join(report_dir, "report.json")):
        with open(os.path.join(report_dir, "report.json")) as f:
            report = json.load(f)
        wall_t0 = (report.get("figures", {}).get("meta") or {}).get("history_wall_t0")
        if wall_t0 is not None:
            attach_faults(stretches, report.get("faults", []), wall_t0)
    return summary(stretches, gaps), stretches


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.chaos.raft_timeline", description=__doc__.split("\n\n")[0])
    p.add_argument("data_dir")
    p.add_argument("--report", default=None)
    p.add_argument("--json", action="store_true", help="print every stretch too")
    args = p.parse_args(argv)
    figs, stretches = analyse(args.data_dir, args.report)
    print(json.dumps(figs))
    if args.json:
        for s in stretches:
            print(json.dumps({"start": round(s.start, 3), "duration_s": round(s.duration_s, 3),
                              "terms": sorted(s.terms), "fault": s.fault}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
