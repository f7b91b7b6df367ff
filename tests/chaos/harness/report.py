"""Chaos run report: figures (operations, faults, anomalies, unavailability windows) as
JSON + Markdown, and an SVG of throughput and latency over time with faults marked
(written by hand: no plotting dependency)."""
from __future__ import annotations

import json
import os
from html import escape
from collections import Counter, defaultdict
from typing import Optional

from tests.chaos.harness.checker import CheckResult, unavailability_windows
from tests.chaos.harness.history import History
from tests.chaos.harness.settle import EXCLUDED_CLASSES, fault_class


def timeline(history: History, bucket_s: float = 1.0) -> list[dict]:
    """Per bucket: acknowledged produces/s and produce latency p50/p99 (ms)."""
    oks: dict[int, list[float]] = defaultdict(list)
    end = 0.0
    for op in history.ops:
        if op.f == "produce" and op.type == "ok":
            oks[int(op.complete_time // bucket_s)].append((op.complete_time - op.invoke_time) * 1000)
        end = max(end, op.complete_time, op.invoke_time)
    out = []
    for b in range(int(end // bucket_s) + 1):
        lat = sorted(oks.get(b, []))
        out.append({"t": b * bucket_s, "ok_per_s": len(lat) / bucket_s,
                    "p50_ms": lat[len(lat) // 2] if lat else None,
                    "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else None})
    return out


def figures(history: History, result: CheckResult, faults: list, min_gap_s: float = 1.0) -> dict:
    ops = Counter(f"{op.f}:{op.type or 'pending'}" for op in history.ops)
    windows = unavailability_windows(history, min_gap_s=min_gap_s)
    fault_counts = Counter(f.kind for f in faults)
    by_partition = {}
    for key in sorted({op.key for op in history.ops if op.f == "produce"}, key=str):
        w = unavailability_windows(history, min_gap_s=min_gap_s, key=key)
        by_partition[f"{key[0]}-{key[1]}"] = {"windows": len(w), "total_s": round(sum(b - a for a, b in w), 2),
                                              "max_s": round(max([b - a for a, b in w] or [0]), 2)}
    return {
        "operations": dict(sorted(ops.items())),
        "operations_total": len(history.ops),
        "faults": dict(sorted(fault_counts.items())),
        "faults_total": len(faults),
        "fault_errors": [{"kind": f.kind, "error": f.error} for f in faults if f.error],
        "anomalies": result.by_kind(),
        "anomalies_total": result.stats.get("anomalies_total", len(result.anomalies)),
        "unavailability_windows": [{"start_s": round(a, 2), "end_s": round(b, 2), "length_s": round(b - a, 2)}
                                   for a, b in windows],
        "unavailable_s_total": round(sum(b - a for a, b in windows), 2),
        "unavailable_s_max": round(max([b - a for a, b in windows] or [0]), 2),
        "unavailability_by_partition": by_partition,
        "windows_by_fault_kind": windows_by_fault_kind(history, faults),
        "checker_stats": result.stats,
    }


def windows_by_fault_kind(history: History, faults: list, f: str = "produce") -> dict:
    """Per fault class (the kind; kill-several split by what it killed, settle.fault_class):
    the longest window without an acknowledged write of one partition (issue 24), over the
    faults of that class. A fault's span runs from its start to the next fault's start
    (hold, heal, settle wait and quiet period), the last one to the last operation of kind
    `f` (the writers stop before the final reads); within it, per (topic, partition), the
    longest stretch without an `ok` of kind `f` (clipped to the span). Next to it the
    recovery time (heal -> settled, Schedule.settle) and how many faults of the class
    started while the previous fault had not settled within its limit (their windows are
    not one fault's). -> {class: {"faults", "max_s", "p50_s", "worst": "topic-partition at
    start s", "recovery_max_s", "recovery_p50_s", "not_settled", "after_unsettled",
    "after_unsettled_at", "excluded" (why, for a class the goal excludes)}}"""
    oks: dict = defaultdict(list)
    end = 0.0
    for op in history.ops:
        if op.f != f:
            continue   # (the final reads come after the writers stopped: not part of any span)
        if op.type == "ok":
            oks[op.key].append(op.complete_time)
        end = max(end, op.complete_time, op.invoke_time)
    for times in oks.values():
        times.sort()
    keys = sorted({op.key for op in history.ops if op.f == f}, key=str)
    ordered = sorted((x for x in faults if x.end >= 0), key=lambda x: x.start)
    per_kind: dict = defaultdict(list)   # class -> [(longest s, key, fault start, fault, previous fault)]
    for n, fault in enumerate(ordered):
        a = fault.start
        b = ordered[n + 1].start if n + 1 < len(ordered) else max(end, fault.end)
        worst = (0.0, None)
        for key in keys:
            pts = [a] + [t for t in oks.get(key, []) if a < t < b] + [b]
            gap = max((y - x for x, y in zip(pts, pts[1:])), default=0.0)
            if gap > worst[0]:
                worst = (gap, key)
        per_kind[fault_class(fault.kind, fault.description)].append(
            (worst[0], worst[1], a, fault, ordered[n - 1] if n else None))
    out = {}
    for kind, rows in sorted(per_kind.items()):
        rows.sort(key=lambda r: r[0])
        top = rows[-1]
        rec = sorted(r[3].recovery_s for r in rows if r[3].recovery_s is not None)
        after = [r for r in rows if r[4] is not None and r[4].settled is False]
        out[kind] = {"faults": len(rows), "max_s": round(top[0], 2), "p50_s": round(rows[len(rows) // 2][0], 2),
                     "worst": f"{top[1][0]}-{top[1][1]} at {top[2]:.1f}s" if top[1] else None,
                     "recovery_max_s": rec[-1] if rec else None,
                     "recovery_p50_s": rec[len(rec) // 2] if rec else None,
                     "not_settled": sum(1 for r in rows if r[3].settled is False),
                     "after_unsettled": len(after),
                     "after_unsettled_at": [f"{r[2]:.1f}s ({r[0]:.2f} s)" for r in sorted(after, key=lambda r: r[2])]}
        if kind in EXCLUDED_CLASSES:
            out[kind]["excluded"] = EXCLUDED_CLASSES[kind]
    return out


def windows_table(by_kind: dict, goal_s: float = 3.0) -> list[str]:
    """The per-class table of report.md (Markdown lines), worst window first."""
    def cell(v):
        return "-" if v is None else f"{v:.2f}"
    lines = ["| fault class | faults | longest window (s) | median (s) | recovery max (s) | recovery median (s) "
             "| not settled | after an unsettled fault | worst |", "|---|---|---|---|---|---|---|---|---|"]
    for kind, v in sorted(by_kind.items(), key=lambda kv: -kv[1]["max_s"]):
        flag = " (excluded)" if v.get("excluded") else (" **over**" if v["max_s"] > goal_s else "")
        lines.append(f"| {kind}{flag} | {v['faults']} | {v['max_s']:.2f} | {v['p50_s']:.2f} | "
                     f"{cell(v['recovery_max_s'])} | {cell(v['recovery_p50_s'])} | {v['not_settled']} | "
                     f"{v['after_unsettled']}{' at ' + ', '.join(v['after_unsettled_at']) if v['after_unsettled'] else ''}"
                     f" | {v['worst']} |")
    lines += [f"- excluded: {k}: {v['excluded']}" for k, v in sorted(by_kind.items()) if v.get("excluded")]
    return lines


def svg_plot(points: list[dict], faults: list, width: int = 1000, height: int = 420) -> str:
    """Throughput (bars) and p50/p99 latency (lines, log scale) over time; faults shaded."""
    pad_l, pad_r, pad_t, pad_b = 60, 60, 30, 40
    w, h = width - pad_l - pad_r, height - pad_t - pad_b
    t_max = max([p["t"] for p in points] + [f.end for f in faults] + [1.0])
    thr_max = max([p["ok_per_s"] for p in points] + [1.0])
    lats = [v for p in points for v in (p["p50_ms"], p["p99_ms"]) if v]
    import math
    lat_lo, lat_hi = math.log10(max(min(lats or [1.0]), 0.5)), math.log10(max(lats or [10.0]) * 1.2)
    if lat_hi - lat_lo < 1:
        lat_hi = lat_lo + 1

    def x(t):
        return pad_l + w * t / t_max

    def y_thr(v):
        return pad_t + h - h * v / thr_max

    def y_lat(v):
        return pad_t + h - h * (math.log10(max(v, 0.5)) - lat_lo) / (lat_hi - lat_lo)

    colors = ["#f4a582", "#92c5de", "#b2df8a", "#fdbf6f", "#cab2d6", "#fb9a99", "#a6cee3", "#ffff99",
              "#b15928", "#33a02c", "#e31a1c", "#1f78b4", "#6a3d9a"]
    kinds = sorted({f.kind for f in faults})
    color = {k: colors[i % len(colors)] for i, k in enumerate(kinds)}
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height + 20 * ((len(kinds) + 3) // 4)}" '
           f'font-family="sans-serif" font-size="11">', '<rect width="100%" height="100%" fill="white"/>']
    for f in faults:
        out.append(f'<rect x="{x(f.start):.1f}" y="{pad_t}" width="{max(1.0, x(f.end) - x(f.start)):.1f}" '
                   f'height="{h}" fill="{color[f.kind]}" opacity="0.45"><title>{escape(f.kind)}: {escape(f.description)}'
                   f'</title></rect>')
    bw = max(1.0, w / max(1, len(points)) - 0.5)
    for p in points:
        out.append(f'<rect x="{x(p["t"]):.1f}" y="{y_thr(p["ok_per_s"]):.1f}" width="{bw:.1f}" '
                   f'height="{pad_t + h - y_thr(p["ok_per_s"]):.1f}" fill="#555" opacity="0.6"/>')
    for key, col in (("p50_ms", "#2166ac"), ("p99_ms", "#b2182b")):
        pts = " ".join(f"{x(p['t']):.1f},{y_lat(p[key]):.1f}" for p in points if p[key])
        if pts:
            out.append(f'<polyline points="{pts}" fill="none" stroke="{col}" stroke-width="1.5"/>')
    out.append(f'<line x1="{pad_l}" y1="{pad_t + h}" x2="{pad_l + w}" y2="{pad_t + h}" stroke="black"/>')
    out.append(f'<line x1="{pad_l}" y1="{pad_t}" x2="{pad_l}" y2="{pad_t + h}" stroke="black"/>')
    out.append(f'<line x1="{pad_l + w}" y1="{pad_t}" x2="{pad_l + w}" y2="{pad_t + h}" stroke="black"/>')
    for i in range(5):
        v = thr_max * i / 4
        out.append(f'<text x="{pad_l - 5}" y="{y_thr(v) + 4:.1f}" text-anchor="end">{v:.0f}</text>')
    for e in range(int(math.floor(lat_lo)), int(math.ceil(lat_hi)) + 1):
        v = 10 ** e
        if lat_lo <= e <= lat_hi:
            out.append(f'<text x="{pad_l + w + 5}" y="{y_lat(v) + 4:.1f}">{v:g} ms</text>')
    for i in range(6):
        t = t_max * i / 5
        out.append(f'<text x="{x(t):.1f}" y="{pad_t + h + 15}" text-anchor="middle">{t:.0f}s</text>')
    out.append(f'<text x="{pad_l}" y="18">acknowledged produces/s (grey bars, left), latency p50 (blue) / '
               f'p99 (red), log scale right; shaded: faults</text>')
    for i, k in enumerate(kinds):
        lx, ly = pad_l + (i % 4) * 220, height + 5 + 20 * (i // 4)
        out.append(f'<rect x="{lx}" y="{ly - 10}" width="12" height="12" fill="{color[k]}"/>'
                   f'<text x="{lx + 16}" y="{ly}">{escape(k)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def _settle_note(x) -> str:
    if x.settled:
        return f" (settled {x.recovery_s:.2f} s after the heal)"
    if x.settled is False:
        return " (NOT SETTLED within the limit: " + "; ".join(x.unsettled) + ")"
    return ""


def _load_range(faults: list) -> str:
    loads = sorted(f.load1 for f in faults if getattr(f, "load1", None) is not None)
    return f"{loads[0]}-{loads[-1]} (median {loads[len(loads) // 2]})" if loads else "not recorded"


def write_report(out_dir: str, history: History, result: CheckResult, faults: list, meta: Optional[dict] = None,
                 min_gap_s: float = 1.0, log_cleaner: Optional[dict] = None) -> dict:
    os.makedirs(out_dir, exist_ok=True)
    figs = figures(history, result, faults, min_gap_s=min_gap_s)
    figs["meta"] = meta or {}
    figs["log_cleaner"] = log_cleaner or {}
    points = timeline(history)
    history.dump(os.path.join(out_dir, "history.jsonl"))
    with open(os.path.join(out_dir, "report.json"), "w") as f:
        json.dump({"figures": figs, "anomalies": [a.to_json() for a in result.anomalies],
                   "faults": [vars(x) for x in faults], "timeline": points}, f, indent=1)
    with open(os.path.join(out_dir, "throughput_latency.svg"), "w") as f:
        f.write(svg_plot(points, faults))
    lines = [f"# kraftlog chaos report", "", f"meta: `{json.dumps(meta or {})}`", "",
             f"- operations: {figs['operations_total']} {figs['operations']}",
             f"- faults: {figs['faults_total']} {figs['faults']}",
             f"- anomalies: {figs['anomalies_total']} {figs['anomalies']}",
             f"- unavailability (no acknowledged produce for > {min_gap_s}s): {len(figs['unavailability_windows'])} "
             f"windows, {figs['unavailable_s_total']} s total, longest {figs['unavailable_s_max']} s; per partition "
             f"{figs['unavailability_by_partition']}",
             f"- nemesis errors: {len(figs['fault_errors'])}",
             f"- log cleaner (summed over broker processes, last sample of each): {json.dumps(log_cleaner or {})}",
             f"- machine load (1 min) at the faults' starts: {_load_range(faults)}",
             f"- acknowledged writes: {result.stats.get('acknowledged_values', 0)}",
             "", "## Longest window without an acknowledged write of one partition, per fault class", "",
             "Span: the fault's start to the next fault's start. Recovery: heal -> settled (every process "
             "up, brokers registered and unfenced, full ISRs, an active controller, an acknowledged write on "
             "every partition since the heal). 'After an unsettled "
             "fault': started while the previous fault had not settled within the limit (not a single "
             "fault's window).", ""] + windows_table(figs["windows_by_fault_kind"]) + [
             "", "![](throughput_latency.svg)", "",
             "## Faults", ""]
    lines += [f"- {x.start:7.1f}s - {x.end:7.1f}s {x.kind}: {x.description}{' ERROR ' + x.error if x.error else ''}"
              f"{_settle_note(x)}" for x in faults]
    lines += ["", "## Anomalies", ""] + [f"- {a}" for a in result.anomalies[:200]]
    lines += ["", "## Unavailability windows", ""] + [
        f"- {w['start_s']}s - {w['end_s']}s ({w['length_s']} s)" for w in figs["unavailability_windows"]]
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return figs
