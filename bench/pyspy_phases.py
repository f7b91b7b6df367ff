"""Where a process's time went, window by window, from a py-spy Chrome trace.

`partitions_scale_bench --profile-kill S --keep DIR` writes `DIR/pyspy-<name>.json` (py-spy
`--format chrometrace`: a begin and an end event per stack frame, microseconds from the
start of the recording, i.e. from moments after the kill). This prints, for each window of
`--window-s` seconds, the sampled seconds (GIL-idle frames are left out, so a window's total
is how busy the process was) and the frames that took the largest share, inclusive:

    python -m bench.pyspy_phases DIR/pyspy-broker-2.json --window-s 1 --top 8
    python -m bench.pyspy_phases DIR/pyspy-broker-2.json --match produce.py   # frames of one file
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict


def frame_spans(events: list) -> list:
    """[(frame label, start us, end us)] of every frame of every thread's stacks; a frame
    whose end is missing (the recording stopped) ends at the last event."""
    last = max((e.get("ts", 0) for e in events), default=0)
    open_frames: dict = defaultdict(list)   # tid -> stack of (label, start)
    spans = []
    for e in sorted(events, key=lambda e: (e.get("ts", 0), e.get("ph") != "E")):
        args = e.get("args") or {}
        label = f"{e.get('name')} ({args.get('filename', '?').rsplit('/', 2)[-1]}:{args.get('line', '?')})"
        stack = open_frames[e.get("tid")]
        if e.get("ph") == "B":
            stack.append((label, e["ts"]))
        elif e.get("ph") == "E" and stack:
            lbl, start = stack.pop()
            spans.append((lbl, start, e["ts"]))
    for stack in open_frames.values():
        spans.extend((lbl, start, last) for lbl, start in stack)
    return spans


def busy_us(events: list) -> list:
    """[(start us, end us)] of the outermost frames: when some thread was sampled running."""
    depth: dict = defaultdict(int)
    spans, starts = [], {}
    for e in sorted(events, key=lambda e: (e.get("ts", 0), e.get("ph") != "E")):
        tid = e.get("tid")
        if e.get("ph") == "B":
            if depth[tid] == 0:
                starts[tid] = e["ts"]
            depth[tid] += 1
        elif e.get("ph") == "E" and depth[tid] > 0:
            depth[tid] -= 1
            if depth[tid] == 0:
                spans.append((starts.pop(tid), e["ts"]))
    return spans


def overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def main(argv: list | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", help="a pyspy-<name>.json written by partitions_scale_bench --profile-kill")
    ap.add_argument("--window-s", type=float, default=1.0, help="window length in seconds")
    ap.add_argument("--top", type=int, default=8, help="frames shown per window")
    ap.add_argument("--match", default="", help="only frames whose label contains this text")
    args = ap.parse_args(argv)
    with open(args.trace) as f:
        data = json.load(f)
    events = data if isinstance(data, list) else data.get("traceEvents", [])
    spans = frame_spans(events)
    busy = busy_us(events)
    end = max((s[2] for s in spans), default=0)
    w = int(args.window_s * 1e6)
    for w0 in range(0, int(end) + 1, w):
        w1 = w0 + w
        sampled = sum(overlap(s, e, w0, w1) for s, e in busy) / 1e6
        per: dict = defaultdict(float)
        for label, s, e in spans:
            if args.match in label:
                per[label] += overlap(s, e, w0, w1)
        top = sorted(per.items(), key=lambda kv: -kv[1])[:args.top]
        print(f"{w0 / 1e6:6.1f}-{w1 / 1e6:<6.1f}s  sampled {sampled:5.2f} s")
        for label, us in top:
            if us > 0:
                print(f"    {us / 1e6:5.2f} s  {label[:140]}")


if __name__ == "__main__":
    main()
