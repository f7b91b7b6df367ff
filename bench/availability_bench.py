"""Availability under a silent host isolation (issue 24), on network-namespace hosts.

Three hosts (tests/rigs/netns.py), each running one combined-mode node (controller + broker,
`kraftlog serve --config nodeI.toml` as in docs/OPERATIONS.md); a topic with 3 partitions,
RF=3, min.insync.replicas=2; one idempotent acks=all writer per partition (one request in
flight, a fresh metadata lookup on every failure: it follows leader changes). Then one host
is cut off silently (every packet dropped, no RST) for `--cut-seconds`:

- `leader`: the host leading one partition but not running the active controller;
- `controller`: the host running the active controller (it leads a partition too).

Figures (printed, not asserted), per partition: the longest window without an acknowledged
write (and where it lies relative to the cut), then acknowledged / lost / duplicated counts
from reading every partition back at the end, and a timeline of what the controllers and
the metadata did (active controller and epoch, fencing, leaders and ISRs).

    sudo python -m bench.availability_bench [--rounds N] [--scenarios leader,controller]
        [--cut-seconds S] [--request-timeout-s S] [--keep-logs DIR]

Needs root (ip netns). Timings on a shared machine are noisy.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Optional

import aiohttp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from http_api.wire import codecs  # noqa: E402
from partitions.log import record_batch as rb  # noqa: E402

TOPIC = "avail"
PARTITIONS = 3


# ---- writers ---------------------------------------------------------------------------

@dataclass
class WriterStats:
    partition: int
    acks: list = field(default_factory=list)          # (monotonic s, value) per acknowledged write
    errors: dict = field(default_factory=dict)        # error kind -> count
    leaders_seen: list = field(default_factory=list)  # (monotonic s, leader id, leader epoch)
    new_producer_ids: int = 0


class MetadataFollower:
    """Asks every broker for metadata at once (short timeout) and keeps, per partition, the
    answer with the highest leader epoch: a writer is never stuck on one stale broker."""

    def __init__(self, urls: list[str], session: aiohttp.ClientSession, timeout_s: float) -> None:
        self.urls = urls
        self.session = session
        self.timeout_s = timeout_s
        self.leaders: dict[int, tuple[int, int, str]] = {}   # partition -> (leader epoch, leader id, url)

    async def _one(self, url: str) -> Optional[dict]:
        try:
            async with self.session.get(url + "/v1/metadata",
                                        timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as r:
                if r.status == 200:
                    return await r.json()
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError):
            pass
        return None

    def _merge(self, doc: Optional[dict]) -> None:
        if not doc:
            return
        brokers = {b["id"]: b["url"].rstrip("/") for b in doc.get("brokers", [])}
        for t in doc.get("topics", []):
            if t["name"] != TOPIC:
                continue
            for p in t["partitions"]:
                cur = self.leaders.get(p["partition"])
                url = brokers.get(p["leader"])
                if url and (cur is None or p["leader_epoch"] > cur[0]):
                    self.leaders[p["partition"]] = (p["leader_epoch"], p["leader"], url)

    async def refresh(self, wait_s: float = 0.25) -> None:
        """Ask every broker; return after `wait_s` (or once all answered): a broker that does
        not answer (cut off) does not hold the writer up, its answer is merged if it comes."""
        tasks = [asyncio.ensure_future(self._one(u)) for u in self.urls]
        for t in tasks:
            t.add_done_callback(lambda f: self._merge(f.result()) if not f.cancelled() else None)
        await asyncio.wait(tasks, timeout=wait_s)

    async def leader(self, partition: int) -> tuple[int, int, str]:
        while partition not in self.leaders:
            await self.refresh()
            if partition not in self.leaders:
                await asyncio.sleep(0.05)
        return self.leaders[partition]


async def _producer_id(follower: MetadataFollower) -> tuple[int, int]:
    while True:
        for url in follower.urls:
            try:
                async with follower.session.post(url + "/v1/producer-ids", json={},
                                                 timeout=aiohttp.ClientTimeout(total=follower.timeout_s)) as r:
                    if r.status == 200:
                        doc = await r.json()
                        return int(doc["producer_id"]), int(doc.get("producer_epoch", 0))
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError):
                pass
        await asyncio.sleep(0.1)


async def partition_writer(partition: int, follower: MetadataFollower, stop: asyncio.Event,
                           request_timeout_s: float, stats: WriterStats, leader_check_s: float = 0.25) -> None:
    """Idempotent acks=all writes of one record each ("p<partition>-<n>"), one in flight; a
    failed or timed-out batch is resent unchanged (same producer id and sequence) to the
    leader that metadata names then, so a resend is never written twice. While a request
    waits, metadata is asked every `leader_check_s`; a new leader (higher leader epoch) gets
    the batch at once (as `http_api.client.Producer` does after its attempt timeout)."""
    pid, epoch = await _producer_id(follower)
    seq = n = 0
    s = follower.session
    while not stop.is_set():
        value = f"p{partition}-{n}".encode()
        payload = rb.build_batch([rb.Record(None, value)], producer_id=pid, producer_epoch=epoch,
                                 base_sequence=seq)
        while not stop.is_set():
            leader_epoch, leader_id, url = await follower.leader(partition)
            if not stats.leaders_seen or stats.leaders_seen[-1][1:] != (leader_id, leader_epoch):
                stats.leaders_seen.append((time.monotonic(), leader_id, leader_epoch))
            kind = None

            async def send() -> tuple[int, bytes]:
                async with s.post(f"{url}/v1/topics/{TOPIC}/partitions/{partition}/records?acks=all",
                                  data=payload, headers={"Content-Type": codecs.RAW_BATCH},
                                  timeout=aiohttp.ClientTimeout(total=request_timeout_s)) as r:
                    return r.status, await r.read()

            req = asyncio.ensure_future(send())
            moved = False
            try:
                # follow metadata while the request waits: once another leader (a higher leader
                # epoch) is named, the same batch goes there (the idempotent resend is safe)
                while True:
                    done, _ = await asyncio.wait({req}, timeout=leader_check_s / 2)
                    if done:
                        break
                    await follower.refresh(wait_s=leader_check_s / 2)
                    if follower.leaders.get(partition, (leader_epoch,))[0] > leader_epoch:
                        moved = True
                        break
                if moved:
                    kind = "leader moved"
                else:
                    status, body = req.result()
                    if status == 200:
                        stats.acks.append((time.monotonic(), value.decode()))
                        break
                    try:
                        kind = json.loads(body).get("error_code", str(status))
                    except ValueError:
                        kind = str(status)
            except asyncio.TimeoutError:
                kind = "client timeout"
            except (aiohttp.ClientError, OSError) as e:
                kind = type(e).__name__
            finally:
                if not req.done():
                    req.cancel()
            stats.errors[kind] = stats.errors.get(kind, 0) + 1
            if kind in ("OUT_OF_ORDER_SEQUENCE_NUMBER", "UNKNOWN_PRODUCER_ID", "INVALID_PRODUCER_EPOCH"):
                # the producer state is gone: start over (a resend may then be a duplicate)
                pid, epoch = await _producer_id(follower)
                seq = 0
                stats.new_producer_ids += 1
                payload = rb.build_batch([rb.Record(None, value)], producer_id=pid, producer_epoch=epoch,
                                         base_sequence=seq)
            await follower.refresh()
            if follower.leaders.get(partition, (None, None))[1] == leader_id:
                await asyncio.sleep(0.05)  # same leader: back off a little
        else:
            return
        seq += 1
        n += 1


# ---- observation -----------------------------------------------------------------------

class Timeline:
    """What the controllers and the metadata said, polled from the root namespace (every host
    not cut off), as (seconds since the cut, event) lines, changes only."""

    def __init__(self) -> None:
        self.t0: Optional[float] = None
        self.events: list[tuple[float, str]] = []
        self._last: dict[str, str] = {}

    def note(self, key: str, text: str) -> None:
        if self._last.get(key) == text:
            return
        self._last[key] = text
        now = time.monotonic()
        self.events.append((now, f"{key}: {text}"))

    def lines(self, t0: float) -> list[str]:
        return [f"{t - t0:+7.2f} s  {e}" for t, e in self.events]


async def monitor(cluster, stop: asyncio.Event, tl: Timeline, session: aiohttp.ClientSession) -> None:
    rig = cluster.rig
    while not stop.is_set():
        for i in rig.hosts:
            if i in rig.cut_hosts:
                continue
            try:
                async with session.get(cluster.controller_url(i) + "/controller/v1/status",
                                       timeout=aiohttp.ClientTimeout(total=1)) as r:
                    st = await r.json()
                tl.note(f"controller {i}", f"leader={st.get('leader_id')} term={st.get('term')} "
                                           f"active={st.get('is_active')}")
                if st.get("is_active"):
                    async with session.get(cluster.controller_url(i) + "/controller/v1/metadata",
                                           timeout=aiohttp.ClientTimeout(total=1)) as r:
                        doc = await r.json()
                    fenced = sorted(b["id"] for b in doc.get("brokers", []) if b.get("fenced"))
                    tl.note("fenced brokers", str(fenced))
                    for t in doc.get("topics", []):
                        if t["name"] != TOPIC:
                            continue
                        for p in t["partitions"]:
                            tl.note(f"p{p['partition']}", f"leader={p['leader']} epoch={p['leader_epoch']} "
                                                          f"isr={p['isr']}")
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError):
                pass
        await asyncio.sleep(0.2)


# ---- one isolation ---------------------------------------------------------------------

@dataclass
class IsolationResult:
    scenario: str
    victim: int
    victim_led: list
    active_before: int
    windows: dict            # partition -> (longest gap s, gap start rel. cut, gap end rel. cut)
    acked: dict              # partition -> count
    lost: dict
    duplicated: dict
    unacked_present: dict    # written but never acknowledged to the writer (in flight at a failure)
    errors: dict
    new_producer_ids: int
    timeline: list
    log_dir: Optional[str] = None

    @property
    def worst_window_s(self) -> float:
        return max(w[0] for w in self.windows.values())


def _longest_gap(times: list[float], start: float, end: float) -> tuple[float, float, float]:
    """Longest stretch in [start, end] without an element of `times` -> (length, from, to)."""
    pts = [start] + sorted(t for t in times if start < t < end) + [end]
    best = (0.0, start, start)
    for a, b in zip(pts, pts[1:]):
        if b - a > best[0]:
            best = (b - a, a, b)
    return best


async def _read_partition(session: aiohttp.ClientSession, follower: MetadataFollower, p: int) -> list[str]:
    out: list[str] = []
    offset = 0
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        await follower.refresh()
        _, _, url = await follower.leader(p)
        try:
            async with session.get(f"{url}/v1/topics/{TOPIC}/partitions/{p}/records",
                                   params={"offset": str(offset), "max_bytes": str(1 << 20)},
                                   timeout=aiohttp.ClientTimeout(total=10)) as r:
                if r.status != 200:
                    await asyncio.sleep(0.2)
                    continue
                doc = await r.json()
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError):
            await asyncio.sleep(0.2)
            continue
        out.extend(rec["value"] for rec in doc["records"])
        offset = doc["next_offset"]
        if offset >= doc["high_watermark"]:
            return out
    raise RuntimeError(f"could not read {TOPIC}-{p} back within 120 s")


def choose_victim(cluster, scenario: str) -> tuple[int, int, list]:
    """-> (host to cut, active controller, partitions the victim leads)."""
    active = cluster.active_controller()
    parts = cluster.partitions(TOPIC)
    if scenario == "controller":
        victim = active
    elif scenario == "leader":
        victim = next(p["leader"] for p in parts if p["leader"] != active)
    else:
        raise ValueError(f"unknown scenario {scenario!r}: use leader or controller")
    return victim, active, [p["partition"] for p in parts if p["leader"] == victim]


async def _isolation(cluster, scenario: str, cut_s: float, warmup_s: float, after_s: float,
                     request_timeout_s: float) -> IsolationResult:
    rig = cluster.rig
    victim, active, led = await asyncio.to_thread(choose_victim, cluster, scenario)
    tl = Timeline()
    stop_writers, stop_monitor = asyncio.Event(), asyncio.Event()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as session:
        follower = MetadataFollower(cluster.urls, session, timeout_s=min(1.0, request_timeout_s))
        await follower.refresh()
        stats = {p: WriterStats(p) for p in range(PARTITIONS)}
        writers = [asyncio.ensure_future(partition_writer(p, follower, stop_writers, request_timeout_s, stats[p]))
                   for p in range(PARTITIONS)]
        mon = asyncio.ensure_future(monitor(cluster, stop_monitor, tl, session))
        await asyncio.sleep(warmup_s)
        t_cut = time.monotonic()
        tl.events.append((t_cut, f"CUT host {victim} (active controller {active}; it leads {led})"))
        await asyncio.to_thread(rig.cut, victim)
        await asyncio.sleep(cut_s)
        t_heal = time.monotonic()
        await asyncio.to_thread(rig.heal, victim)
        tl.events.append((t_heal, f"HEAL host {victim}"))
        await asyncio.sleep(after_s)
        t_end = time.monotonic()
        stop_writers.set()
        await asyncio.wait(writers, timeout=request_timeout_s + 5)
        for w in writers:
            w.cancel()
        # let the ISR recover before reading back (every replica fetches again)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                parts = await asyncio.to_thread(cluster.partitions, TOPIC)
                if all(len(p["isr"]) == 3 for p in parts):
                    break
            except Exception:  # noqa: BLE001 - a controller election in progress
                pass
            await asyncio.sleep(0.2)
        stop_monitor.set()
        await mon
        windows, acked, lost, dup, extra = {}, {}, {}, {}, {}
        for p in range(PARTITIONS):
            got = await _read_partition(session, follower, p)
            counts: dict[str, int] = {}
            for v in got:
                counts[v] = counts.get(v, 0) + 1
            acked_values = {v for _, v in stats[p].acks}
            acked[p] = len(stats[p].acks)
            lost[p] = sum(1 for v in acked_values if v not in counts)
            dup[p] = sum(c - 1 for c in counts.values() if c > 1)
            extra[p] = sum(1 for v in counts if v not in acked_values)
            length, a, b = _longest_gap([t for t, _ in stats[p].acks], t_cut - 1.0, t_end)
            windows[p] = (length, a - t_cut, b - t_cut)
            for t, lid, le in stats[p].leaders_seen:
                tl.events.append((t, f"writer p{p}: sends to leader {lid} (epoch {le})"))
    errors: dict = {}
    for st in stats.values():
        for k, v in st.errors.items():
            errors[k] = errors.get(k, 0) + v
    tl.events.sort(key=lambda e: e[0])
    return IsolationResult(scenario, victim, led, active, windows, acked, lost, dup, extra, errors,
                           sum(st.new_producer_ids for st in stats.values()), tl.lines(t_cut))


def run_isolation(base_dir: str, scenario: str, *, cut_s: float = 20.0, warmup_s: float = 3.0,
                  after_s: float = 12.0, request_timeout_s: float = 1.0,
                  settings: Optional[dict] = None) -> IsolationResult:
    """A fresh 3-host cluster on a fresh rig, one silent isolation, everything torn down."""
    from tests.rigs.netns import NetnsKraftlogCluster, NetnsRig

    rig = NetnsRig(3)
    with rig:
        cluster = NetnsKraftlogCluster(rig, base_dir, settings=settings)
        try:
            cluster.start()
            cluster.create_topic(TOPIC, PARTITIONS, 3, {"min.insync.replicas": "2"})
            return asyncio.run(_isolation(cluster, scenario, cut_s, warmup_s, after_s, request_timeout_s))
        finally:
            cluster.close()


def print_result(r: IsolationResult, show_timeline: bool = True) -> None:
    print(f"[{r.scenario}] cut host {r.victim} (leads partitions {r.victim_led}; active controller was "
          f"{r.active_before})")
    for p in sorted(r.windows):
        w, a, b = r.windows[p]
        print(f"  p{p}: longest window without an acked write {w:5.2f} s (from {a:+.2f} to {b:+.2f} s rel. cut)"
              f"  acked {r.acked[p]:>6}  lost {r.lost[p]}  duplicated {r.duplicated[p]}"
              f"  written-unacked {r.unacked_present[p]}")
    print(f"  writer errors: {dict(sorted(r.errors.items(), key=lambda kv: -kv[1]))}"
          + (f"; new producer ids: {r.new_producer_ids}" if r.new_producer_ids else ""))
    if show_timeline:
        for line in r.timeline:
            print("   " + line)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=1, help="isolations per scenario (a fresh cluster each)")
    ap.add_argument("--scenarios", default="leader,controller")
    ap.add_argument("--cut-seconds", type=float, default=20.0)
    ap.add_argument("--warmup-seconds", type=float, default=3.0)
    ap.add_argument("--after-seconds", type=float, default=12.0, help="writes measured after the heal")
    ap.add_argument("--request-timeout-s", type=float, default=1.0, help="writer's per-request timeout")
    ap.add_argument("--keep-logs", default=None, help="keep every round's node logs and configs under DIR")
    ap.add_argument("--no-timeline", action="store_true")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("availability bench skipped: it needs root (network namespaces)")
        return 0
    base = args.keep_logs or tempfile.mkdtemp(prefix="kraftlog-avail-bench-")
    os.makedirs(base, exist_ok=True)
    print(f"data and node logs under {base}" + ("" if args.keep_logs else " (removed at the end)"))
    summary: dict[str, list[IsolationResult]] = {}
    try:
        for scenario in [s.strip() for s in args.scenarios.split(",") if s.strip()]:
            for r in range(args.rounds):
                d = os.path.join(base, f"{scenario}-{r + 1}")
                res = run_isolation(d, scenario, cut_s=args.cut_seconds, warmup_s=args.warmup_seconds,
                                    after_s=args.after_seconds, request_timeout_s=args.request_timeout_s)
                res.log_dir = d
                print_result(res, not args.no_timeline)
                sys.stdout.flush()
                summary.setdefault(scenario, []).append(res)
        print(f"summary ({args.cut_seconds:.0f} s silent cut, 3 partitions RF=3 min.insync.replicas=2, "
              f"acks=all idempotent writers, {args.request_timeout_s:g} s client timeout; shared CPU: noisy):")
        for scenario, results in summary.items():
            worst = [round(x.worst_window_s, 2) for x in results]
            print(f"  {scenario}: worst per-partition window per round {worst} s; acked "
                  f"{sum(sum(x.acked.values()) for x in results)}, lost {sum(sum(x.lost.values()) for x in results)}, "
                  f"duplicated {sum(sum(x.duplicated.values()) for x in results)}")
    finally:
        if not args.keep_logs:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
