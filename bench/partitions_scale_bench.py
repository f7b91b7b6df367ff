"""Partitions at scale (issue 25): `python -m bench.partitions_scale_bench [--partitions 10000]
[--topics 3] [--rf 3]`.

A real cluster of 3 controllers (a Raft quorum; `--controllers 1` for a loaded machine)
and 3 brokers, as `cluster up --nodes 3` runs them, on free ports. Prints:
- per topic of `--partitions` partitions at `--rf`: time until `POST /v1/topics` answers
  (201, or 202 "creating") and until EVERY partition is writable (a produce at each partition's
  leader, one request per leader broker with a record for each of its partitions, `--acks`
  (default all), answered 200 for that partition), for `--topics` topics in turn; each
  broker's longest event-loop stall (`kraftlog_event_loop_lag_ms`) meanwhile and while idle;
- idle broker CPU (% of a core, from /proc/<pid>/stat) over `--idle-seconds` after each topic;
- broker and controller RSS per partition (process RSS growth over the empty cluster,
  divided by the partition replicas a broker hosts / the partitions the controller holds),
  and each broker's open file descriptors (segment files are bounded by
  `open_segment_files_max`, partitions/log/segment.py);
- kill -9 of the broker leading the most partitions (about a third): time until every
  partition it led is writable again (acks=1 produces in requests of 200 partitions each,
  sent to the broker expected to lead them, retried until answered 200), as a distribution
  over those partitions.
`--log-layer N` instead measures one broker's log layer in-process (no cluster): N logs
created through `LogManager.create_logs` in batches of 512 (as the replica manager does),
then one append to each (no flush: brokers leave that to flush.ms), printing ms per log, open descriptors and RSS per log.
`--fetch-poll N` measures the leader side of follower fetching in-process (no cluster, in-memory
logs): one leader of N partitions (RF=3), one follower; per round, one append to one
partition, then (a) a sessionless replica fetch naming all N partitions and (b) an
incremental fetch-session request naming the one partition whose offset changed (KIP-227),
alternating, plus the same two with no append (an idle poll) and an idle session poll that
restates every partition's follower liveness (due once per `FETCH_SESSION_REFRESH_MS`, so on
every idle long poll of `replica_fetch_wait_max_ms`). Prints the CPU time per
poll of each and their ratio (same process, same rounds).
`--failover-pipeline N` measures the metadata side of a kill -9 in-process (see
`failover_pipeline`). Figures are printed, not asserted (2 shared cores: expect noise).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import statistics
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

import aiohttp

from tests.rigs.cluster import ReplicatedCluster, http


def row(name: str, value: str) -> None:
    print(f"| {name:<62} | {value:>30} |", flush=True)


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def open_fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` so far (s)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_cpu(pids: dict, seconds: float) -> dict:
    """Each process's CPU use (% of one core) over `seconds` of wall time."""
    t0, c0 = time.monotonic(), {k: cpu_seconds(p) for k, p in pids.items()}
    time.sleep(seconds)   # measuring an interval, not synchronising
    wall = time.monotonic() - t0
    return {k: (cpu_seconds(p) - c0[k]) * 100 / wall for k, p in pids.items()}


def writable(urls: dict, topic: str, partitions: list, deadline_s: float, acks: str = "all") -> float:
    """Seconds until every partition of `partitions` took a produce at its leader (as a
    Kafka client sends: one request per leader broker holding a record for each of its
    partitions, the requests to all leaders at once, answered 200 for that partition;
    `urls`: broker id -> URL). Partitions that
    fail are retried after a metadata refresh. (Producing all of them through one broker
    made that broker forward thousands of single-partition requests at once: the bench,
    not the cluster, then held its event loop for tens of seconds.)"""
    t0 = time.monotonic()
    todo = set(partitions)
    last = ""
    any_url = next(iter(urls.values()))
    while True:
        by_leader: dict = {}
        for p, leader in topic_leaders(any_url, topic).items():
            if p in todo and leader in urls:
                by_leader.setdefault(leader, []).append(p)
        def send(leader: int, ps: list) -> tuple:
            body = {"records": [{"value": "w", "partition": p} for p in ps]}
            return ps, http("POST", f"{urls[leader]}/v1/topics/{topic}/records?acks={acks}", body, timeout=120)
        # one request per leader broker, all at once (as a producer sends to every leader; in
        # turn, the third waited for the first two: ~2/3 of the figure until the ninth round)
        with ThreadPoolExecutor(max_workers=max(1, len(by_leader))) as pool:
            answers = list(pool.map(lambda item: send(*item), by_leader.items()))
        for ps, (status, doc) in answers:
            if status == 200:
                todo.difference_update(ps)
                continue
            last = f"{status} {str(doc)[:300]}"
            for e in (doc.get("offsets", []) if isinstance(doc, dict) else []):
                if "error_code" not in e and "partition" in e:
                    todo.discard(e["partition"])
        if not todo:
            return time.monotonic() - t0
        if time.monotonic() - t0 > deadline_s:
            raise RuntimeError(f"{topic}: {len(todo)} partitions not writable after {deadline_s} s: {last}")
        time.sleep(1.0)   # each try is a request for many partitions: do not flood the brokers


async def led_writable(urls: dict, predicted: dict, since: float, deadline_s: float,
                       chunk_partitions: int = 200, answers: Optional[list] = None) -> dict:
    """(topic, partition) -> seconds from `since` until a produce to it answered 200, as a
    Kafka client writes after a leader failure: records for many partitions in one request
    per chunk, sent to the broker expected to lead them now (`predicted`: (topic, partition)
    -> broker id; `urls`: the live brokers). The broker holds a request whose partitions
    have no live leader yet until its metadata moves (up to request_timeout_ms), so an
    answer comes when its partitions are writable; a partition's time is its chunk's answer
    (an upper bound: the chunk's slowest partition). A refused partition is retried at the
    other live broker. (One request per partition through one broker, the earlier way,
    measured the bench's own request rate at 33,000 partitions, not the cluster.)
    `answers`, if given, gets (round, seconds from `since`, HTTP status or the client error,
    the error codes of its partitions) per request, to tell a slow tail's cause."""
    done: dict = {}
    rnd = 0
    todo: dict = dict(predicted)
    ids = sorted(urls)
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=60)) as s:

        async def chunk(broker: int, topic: str, ps: list) -> None:
            body = {"records": [{"value": "k", "partition": p} for p in ps]}
            try:
                async with s.post(f"{urls[broker]}/v1/topics/{topic}/records?acks=1", json=body) as r:
                    doc = await r.json(content_type=None)
                    status = r.status
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
                if answers is not None:
                    answers.append((rnd, time.monotonic() - since, type(exc).__name__, ()))
                return
            at = time.monotonic() - since
            if answers is not None:
                answers.append((rnd, at, status, tuple(sorted({e["error_code"] for e in (
                    doc.get("offsets", []) if isinstance(doc, dict) else []) if "error_code" in e}))))
            if status == 200:
                for p in ps:
                    done[(topic, p)] = at
                return
            for e in (doc.get("offsets", []) if isinstance(doc, dict) else []):
                if "error_code" not in e and "partition" in e:
                    done[(topic, e["partition"])] = at

        while todo and time.monotonic() - since < deadline_s:
            groups: dict = {}
            for (t, p), b in todo.items():
                groups.setdefault((b, t), []).append(p)
            jobs = []
            for (b, t), ps in groups.items():
                jobs.extend(chunk(b, t, ps[i:i + chunk_partitions]) for i in range(0, len(ps), chunk_partitions))
            rnd += 1
            await asyncio.gather(*jobs)
            # not yet writable there: try the other live broker next round
            todo = {k: ids[(ids.index(b) + 1) % len(ids)] for k, b in todo.items() if k not in done}
            if todo:
                await asyncio.sleep(0.05)
    return done


def kill_plan(url: str) -> tuple:
    """(victim, predicted, partitions, alone) from one `/v1/metadata` of the broker at `url`:
    the broker leading the most partitions, for each partition it leads the broker the
    controller elects when it is fenced (the first replica in the ISR other than it), and
    how many it leads with no other ISR member (no successor in the ISR: not measured, the
    count is printed)."""
    status, doc = http("GET", url + "/v1/metadata", timeout=120)
    assert status == 200, doc
    counts: dict = {}
    total = 0
    for t in doc["topics"]:
        for p in t["partitions"]:
            counts[p["leader"]] = counts.get(p["leader"], 0) + 1
            total += 1
    victim = max((b for b in counts if b >= 0), key=lambda b: counts[b])
    predicted: dict = {}
    alone = 0
    for t in doc["topics"]:
        for p in t["partitions"]:
            if p["leader"] == victim:
                nxt = [r for r in p["replicas"] if r in p["isr"] and r != victim]
                if nxt:
                    predicted[(t["name"], p["partition"])] = nxt[0]
                else:
                    alone += 1
    return victim, predicted, total, alone


def wait_metadata_caught_up(urls: dict, deadline_s: float) -> bool:
    """Poll every broker's /healthz until its metadata lag is 0 records (True), or give up
    after `deadline_s` (False): a kill -9 measured while brokers still apply earlier changes
    measures those too."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline_s:
        lags = []
        for u in urls.values():
            status, h = http("GET", u + "/healthz", timeout=30)
            lags.append(h.get("metadata_lag_records") if isinstance(h, dict) else None)
        if all(lag == 0 for lag in lags):
            return True
        time.sleep(1.0)   # polling a condition with a deadline
    return False


def wait_unfenced(url: str, brokers: int, deadline_s: float) -> float:
    """Poll `GET /v1/brokers` until `brokers` brokers are unfenced; the seconds waited. A
    create while one is fenced (heartbeats unanswered while the controllers elect) is
    refused INVALID_REPLICATION_FACTOR, which ended earlier 100,000-partition runs."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline_s:
        status, doc = http("GET", url + "/v1/brokers", timeout=30)
        if status == 200 and sum(1 for b in doc.get("brokers", []) if not b.get("fenced")) >= brokers:
            break
        time.sleep(1.0)   # polling a condition with a deadline
    return time.monotonic() - t0


def topic_leaders(url: str, topic: str) -> dict:
    """partition -> leader of one topic (`GET /v1/topics/{t}`: polling `/v1/metadata` once a
    second held a broker's event loop for seconds at 60,000 partitions, the bench's own load)."""
    status, doc = http("GET", f"{url}/v1/topics/{topic}", timeout=120)
    if status != 200:   # not on this broker yet (a create answered 202): none this round
        return {}
    return {p["partition"]: p["leader"] for p in doc["partitions"]}


def leaders(url: str) -> dict:
    status, doc = http("GET", url + "/v1/metadata", timeout=120)
    assert status == 200, doc
    out: dict = {}
    for t in doc["topics"]:
        for p in t["partitions"]:
            out[(t["name"], p["partition"])] = p["leader"]
    return out


def loop_lag_ms(url: str) -> float | None:
    """The broker's `kraftlog_event_loop_lag_ms` (longest event-loop stall of the last 10-20 s)."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
            text = r.read().decode()
    except Exception:  # noqa: BLE001 - a broker too busy to answer: no figure
        return None
    for line in text.splitlines():
        if line.startswith("kraftlog_event_loop_lag_ms "):
            return float(line.split()[1])
    return None


class LagSampler:
    """Samples every broker's event-loop lag every `every_s` in a thread; `take()` -> the
    largest stall per broker since the last take (ms; None: never answered)."""

    def __init__(self, urls: dict, every_s: float = 5.0) -> None:
        self.urls, self.every_s = urls, every_s
        self.max: dict = {b: None for b in urls}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            for b, u in self.urls.items():
                v = loop_lag_ms(u)
                if v is not None:
                    self.max[b] = v if self.max[b] is None else max(self.max[b], v)

    def take(self) -> str:
        out, self.max = self.max, {b: None for b in self.urls}
        return " / ".join("-" if out[b] is None else f"{out[b]:.0f}" for b in sorted(out))

    def stop(self) -> None:
        self._stop.set()


def pct(values: list, q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def run(partitions: int, topics: int, rf: int, base_dir: str, controllers: int = 3, acks: str = "all",
        kill: bool = True, idle_s: float = 10.0, writable_s: float = 300.0, profile_kill_s: float = 0.0,
        controller_args: list | None = None) -> None:
    print(f"cluster: {controllers} controller(s) + 3 brokers; {topics} topic(s) x {partitions} partitions, RF={rf}"
          + (f"; controller options {' '.join(controller_args)}" if controller_args else ""))
    with ReplicatedCluster(base_dir, brokers=3, controllers=controllers,
                           broker_config={"metadata_wait_ms": 60_000}, controller_args=controller_args) as c:
        url = c.url(1)
        active = c.controllers.wait_active(60)
        ctl_pid = c.controllers.procs[active].pid
        time.sleep(1.0)
        base_broker = {b: rss_mb(c.procs[b].pid) for b in c.procs}
        base_ctl = rss_mb(ctl_pid)
        print("| figure" + " " * 57 + "| value" + " " * 26 + "|")
        lag = LagSampler({b: c.url(b) for b in c.procs})
        for i in range(topics):
            name = f"scale{i}"
            waited = wait_unfenced(url, 3, 300)
            if waited >= 1.0:
                row(f"{name}: waited for 3 unfenced brokers before the create", f"{waited:.1f} s")
            t0 = time.monotonic()
            status, doc = http("POST", url + "/v1/topics",
                               {"name": name, "partitions": partitions, "replication_factor": rf}, timeout=300)
            answered = time.monotonic() - t0
            if status not in (201, 202):
                raise RuntimeError(f"create {name}: {status} {str(doc)[:300]}")
            row(f"{name}: create answered ({status})", f"{answered:.2f} s")
            try:
                w = writable({b: c.url(b) for b in c.procs}, name, list(range(partitions)), writable_s, acks)
            except RuntimeError as e:
                row(f"{name}: NOT every partition writable", f"within {writable_s:.0f} s")
                print(f"  ({e})")
                w = None
            if w is not None:
                row(f"{name}: every partition writable, acks={acks} (from the create call)", f"{answered + w:.2f} s")
                row(f"{name}: wall time per partition replica on a broker",
                    f"{(answered + w) * 1000 / (partitions * rf / 3):.3f} ms")
            row(f"{name}: max event-loop stall per broker, create + writable", f"{lag.take()} ms")
            if idle_s > 0:
                time.sleep(2.0)   # let the create's follow-up work (ISR, first fetches) finish
                lag.take()
                cpu = idle_cpu({b: c.procs[b].pid for b in c.procs}, idle_s)
                row(f"idle broker CPU at {partitions * (i + 1)} partitions (% of a core, per broker)",
                    " / ".join(f"{cpu[b]:.1f}" for b in sorted(cpu)))
                row("max event-loop stall per broker, idle", f"{lag.take()} ms")
        total = partitions * topics
        time.sleep(2.0)
        for b in sorted(c.procs):
            grown = rss_mb(c.procs[b].pid) - base_broker[b]
            hosted = total * rf / 3
            row(f"broker {b} RSS growth / replica hosted ({hosted:.0f})", f"{grown * 1024 / hosted:.2f} KiB")
            row(f"broker {b} open file descriptors", str(open_fds(c.procs[b].pid)))
        grown = rss_mb(ctl_pid) - base_ctl
        row(f"active controller RSS growth / partition ({total})", f"{grown * 1024 / total:.2f} KiB")
        for b in sorted(c.procs):
            status, h = http("GET", c.url(b) + "/healthz")
            h = h if isinstance(h, dict) else {"metadata_lag_records": f"({status} {str(h)[:40]})"}
            row(f"broker {b} /healthz metadata_lag_records / _ms", f"{h.get('metadata_lag_records')} / "
                f"{h.get('metadata_lag_ms')}")

        if not kill:
            return
        # kill -9 of the broker leading the most partitions (about a third when balanced)
        settled = wait_metadata_caught_up({b: c.url(b) for b in c.procs}, 300)
        row("every broker's metadata caught up before the kill", "yes" if settled else "NO (300 s)")
        victim, predicted, total_now, alone = kill_plan(c.url(1))
        survivors = {b: c.url(b) for b in c.procs if b != victim}
        row(f"partitions led by broker {victim} before its kill -9", f"{len(predicted)} of {total_now}")
        row(f"partitions led by broker {victim} with no other ISR member (not measured)", str(alone))
        # each process's CPU from the kill until the last partition is writable again: on 2
        # cores the failover's wall time is mostly how much CPU it needs in total
        watched = {f"broker {b}": c.procs[b].pid for b in survivors} | {
            f"controller {n}{' (active)' if n == active else ''}": p.pid for n, p in c.controllers.procs.items()}
        cpu0 = {k: cpu_seconds(p) for k, p in watched.items()} | {"this bench client": time.process_time()}
        killed_at = time.monotonic()
        c.kill(victim)
        print(f"  killed broker {victim} at {time.strftime('%H:%M:%S')} UTC", flush=True)
        spies = profile_after_kill({f"broker-{b}": c.procs[b].pid for b in survivors} |
                                   {f"controller-{active}": ctl_pid}, base_dir, profile_kill_s)
        answers: list = []
        done = asyncio.run(led_writable(survivors, predicted, killed_at, 300, answers=answers))
        window = time.monotonic() - killed_at
        cpu1 = {k: cpu_seconds(p) for k, p in watched.items()} | {"this bench client": time.process_time()}
        used = {k: cpu1[k] - cpu0[k] for k in cpu0}
        row(f"kill -9: CPU s in the {window:.2f} s until the last answer (2 cores: {2 * window:.1f})",
            f"{sum(used.values()):.2f}")
        for k, v in used.items():
            row(f"  {k}", f"{v:.2f}")
        by_round: dict = {}
        for rnd, at, status, codes in answers:
            by_round.setdefault(rnd, []).append((at, status, codes))
        for rnd, rows in sorted(by_round.items()):
            kinds: dict = {}
            for _, status, codes in rows:
                key = f"{status}" + (f" {'/'.join(codes)}" if codes else "")
                kinds[key] = kinds.get(key, 0) + 1
            ats = [a for a, _, _ in rows]
            row(f"kill -9: produce round {rnd}: requests answered {min(ats):.2f}-{max(ats):.2f} s",
                ", ".join(f"{k}: {v}" for k, v in sorted(kinds.items())))
        times = list(done.values())
        if len(done) < len(predicted):
            row("kill -9: partitions NOT writable again within 300 s", str(len(predicted) - len(done)))
        if times:
            row("kill -9: partitions writable again (count)", str(len(times)))
            row("kill -9: time to writable p50 / p90", f"{pct(times, .5):.2f} / {pct(times, .9):.2f} s")
            row("kill -9: time to writable p99 / max", f"{pct(times, .99):.2f} / {max(times):.2f} s")
            row("kill -9: writable within 5 s", f"{sum(1 for x in times if x <= 5.0)} of {len(predicted)}")
            after = leaders(c.url(next(iter(survivors))))
            row(f"leaders still on broker {victim} after the run", str(sum(1 for v in after.values() if v == victim)))
        for p in spies:
            p.wait()


def profile_after_kill(pids: dict, out_dir: str, seconds: float) -> list:
    """`py-spy record` (raw collapsed stacks, 50 Hz, GIL-idle frames left out) of each of
    `pids` ({name: pid}) for `seconds` from the kill, one recording per second in turn
    (`out_dir`/pyspy-<name>-<second>.txt, second 00 starting at the kill), so the failover's
    phases can be told apart: `python -m bench.pyspy_phases DIR/pyspy-broker-2` prints what
    each second held. Nothing when `seconds` is 0. Returns objects to `wait()` for."""
    import subprocess
    import sys
    import threading
    if seconds <= 0:
        return []
    spy = os.path.join(os.path.dirname(sys.executable), "py-spy")
    start = time.monotonic()

    def record(name: str, pid: int) -> None:
        for k in range(int(seconds)):
            delay = start + k - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            subprocess.run([spy, "record", "--format", "raw", "--rate", "50", "--nonblocking",
                            "--duration", "1", "--pid", str(pid),
                            "--output", os.path.join(out_dir, f"pyspy-{name}-{k:02d}.txt")],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    class _Recorder:
        def __init__(self, name: str, pid: int) -> None:
            self.thread = threading.Thread(target=record, args=(name, pid), daemon=True)
            self.thread.start()

        def wait(self) -> None:
            self.thread.join()
    return [_Recorder(name, pid) for name, pid in pids.items()]


def log_layer(n: int, base_dir: str) -> None:
    """One broker's log layer for `n` partition replicas (see the module docstring)."""
    from partitions.log.config import LogConfig
    from partitions.log.log_manager import LogManager
    from partitions.log.record_batch import Record, build_batch
    pid = os.getpid()
    m = LogManager([base_dir], LogConfig())
    m.open_all()
    rss0, fds0 = rss_mb(pid), open_fds(pid)
    specs = [("scale", p, None) for p in range(n)]
    t0 = time.perf_counter()
    for i in range(0, n, 512):
        m.create_logs(specs[i:i + 512])
    created = time.perf_counter() - t0
    row(f"{n} logs created (batches of 512)", f"{created * 1000 / n:.3f} ms/log")
    batch = build_batch([Record(None, b"w", timestamp=1)])
    t0 = time.perf_counter()
    failed = 0
    for lg in m.all_logs():
        try:
            lg.append_as_leader(batch, 0)
        except OSError as e:
            failed += 1
            if failed == 1:
                print(f"  first append failure: {e!r}")
    written = time.perf_counter() - t0
    row("first append to every log", f"{written * 1000 / n:.3f} ms/log")
    row("appends failed (EMFILE before bounded descriptors)", str(failed))
    logs = m.all_logs()
    t0, c0 = time.perf_counter(), time.process_time()
    for lg in logs:
        lg.apply_retention()
    row("retention check of every log (nothing to delete), wall / CPU",
        f"{(time.perf_counter() - t0) * 1e6 / n:.1f} / {(time.process_time() - c0) * 1e6 / n:.1f} us/log")
    row("open descriptors (growth)", str(open_fds(pid) - fds0))
    row("RSS growth per log", f"{(rss_mb(pid) - rss0) * 1024 / n:.2f} KiB")
    m.close()


def fetch_poll(n: int, rounds: int) -> None:
    """Leader-side CPU per follower poll, sessionless vs incremental session (see the module
    docstring)."""
    from metadata_quorum.image import MetadataImage
    from metadata_quorum.records import PartitionRecord, RegisterBrokerRecord, TopicRecord
    from partitions.log.record_batch import Record, build_batch
    from partitions.replication.replica_manager import ReplicaManager
    from partitions.replication.replica_state import ReplicaFetchRequest
    from tests.unit.replication.fake_log import MemoryLogManager

    async def go() -> None:
        img = MetadataImage("c")
        for b in (1, 2, 3):
            img.replay(RegisterBrokerRecord(b, f"i{b}", -1, f"http://b{b}", None, False))
        img.replay(TopicRecord("t", "tid"))
        for p in range(n):
            img.replay(PartitionRecord("t", "tid", p, (1, 2, 3), (1, 2, 3), 1, 1, 1))
        rm = ReplicaManager(1, MemoryLogManager())
        await rm.apply_metadata(img)
        offsets = [0] * n
        batch = build_batch([Record(None, b"v")])
        kw = {"max_bytes": 8 << 20, "partition_max_bytes": 1 << 20, "max_wait_ms": 0, "broker_epoch": -1}
        sid, _, _ = await rm.replica_fetch_session(2, 0, 0, [ReplicaFetchRequest("t", p, 0, 1) for p in range(n)],
                                                   [], **kw)
        epoch = 1
        times: dict = {"full, one append": [], "session, one append": [], "full, idle": [], "session, idle": [],
                       "session, idle, liveness refresh due": []}
        refresh_ms = rm.fetch_session_refresh_ms

        async def full_poll() -> None:
            await rm.replica_fetch(2, [ReplicaFetchRequest("t", p, offsets[p], 1) for p in range(n)], **kw)

        for r in range(rounds):
            for mode in ("full", "session"):
                p = (r * 2 + (mode == "session")) % n
                await rm.append("t", p, batch, acks=1)
                t0 = time.process_time()
                if mode == "full":
                    await full_poll()
                else:
                    await rm.replica_fetch_session(2, sid, epoch, [], [], **kw)
                    epoch += 1
                times[f"{mode}, one append"].append(time.process_time() - t0)
                offsets[p] += 1
                t0 = time.process_time()
                if mode == "full":
                    await full_poll()
                else:
                    await rm.replica_fetch_session(2, sid, epoch,
                                                   [ReplicaFetchRequest("t", p, offsets[p], 1)], [], **kw)
                    epoch += 1
                times[f"{mode}, idle"].append(time.process_time() - t0)
                if mode == "session":   # an idle long poll ends every replica_fetch_wait_max_ms: a refresh is due
                    rm.fetch_session_refresh_ms = 0
                    t0 = time.process_time()
                    await rm.replica_fetch_session(2, sid, epoch, [], [], **kw)
                    times["session, idle, liveness refresh due"].append(time.process_time() - t0)
                    epoch += 1
                    rm.fetch_session_refresh_ms = refresh_ms
        med = {k: statistics.mean(v) * 1000 for k, v in times.items()}   # mean: the periodic refresh included
        for k, v in med.items():
            row(f"{n} partitions: leader CPU per poll (mean), {k}", f"{v:.3f} ms")
        row("ratio full / session, one append", f"{med['full, one append'] / med['session, one append']:.1f}x")
        row("ratio full / session, idle poll", f"{med['full, idle'] / med['session, idle']:.1f}x")
        row("ratio full / session, idle poll with the liveness refresh",
            f"{med['full, idle'] / med['session, idle, liveness refresh due']:.1f}x")
    asyncio.run(go())


def failover_pipeline(n: int) -> None:
    """In-process: the metadata side of a kill -9 at `n` partitions (10 topics, RF=3, 3
    brokers; broker 2, leading a third, is fenced). CPU time (process_time) of each stage of
    the metadata path, for the critical path (the entries until every partition broker 2 led
    has its new leader on the surviving replica managers) and for every entry of the fencing
    (the ISR removals that follow):

    - decide: the active controller's `fence_broker` / `maintenance` (controller.py);
    - plain data: `records.entry_items` of the decided records (the raft entry: runs of
      partition records as columns);
    - raft entry pickle / unpickle: pysyncobj's encoding of the entry (pickled once by the
      leader, unpickled by each follower controller);
    - state machine apply: one controller's `MetadataStateMachine.apply` (all 3 run it);
    - feed encode: the controller's page texts with runs (`feed_page(..., runs=True)`, each
      page encoded once for every broker) in pages of 5,000 records;
    - feed decode / FeedState / apply_metadata: per surviving broker (both run them): the
      page JSON decode, `FeedState.accept` (records, image clone, replay) and
      `ReplicaManager.apply_metadata` (in-memory logs).

    "one chain": the stages one record passes in turn (decide + plain data + pickle +
    unpickle + one controller's apply + feed encode + one broker's decode, FeedState and
    apply_metadata): in the cluster the 3 controllers and 2 brokers run their copies in
    parallel (on 2 cores)."""
    import json as _json

    from pysyncobj import pickle as _pickle

    from metadata_quorum.controller_server import feed_page_text
    from metadata_quorum.feed import FeedState
    from metadata_quorum.records import entry_items
    from metadata_quorum.state_machine import GC_FREEZE_MIN_RECORDS_DEFAULT, MetadataStateMachine
    from partitions.replication.replica_manager import ReplicaManager
    from tests.unit.replication.fake_log import MemoryLogManager
    try:   # brokers hold full collections off during a large change (since 0162983)
        from metadata_quorum.state_machine import FullCollectionHold
    except ImportError:
        FullCollectionHold = None
    import contextlib

    from metadata_quorum import controller_server as _controller_server
    controller_write_holds = hasattr(_controller_server.ControllerServer, "_decide_entry")
    import gc

    full_gcs = [0, 0.0, 0.0]   # full collections: count, CPU seconds, start

    def on_gc(phase: str, info: dict) -> None:
        if info["generation"] == 2:
            if phase == "start":
                full_gcs[2] = time.process_time()
            else:
                full_gcs[0] += 1
                full_gcs[1] += time.process_time() - full_gcs[2]
    gc.callbacks.append(on_gc)
    # as the controller process runs it: full collections held off during a large apply
    from tests.rigs.metadata_image import ImageBuilder
    built = ImageBuilder(MetadataStateMachine(feed_retained_records=10 ** 7,
                                              gc_freeze_min_records=GC_FREEZE_MIN_RECORDS_DEFAULT), seed=1)
    sm, c, write = built.sm, built.controller, built.write
    for i in range(10):
        built.create(f"scale{i}", n // 10, 3)
    led = {(t.name, p.partition) for t in sm.image.topics.values() for p in t.partitions.values() if p.leader == 2}
    stages = ("decide (controller.py)", "plain data (entry_items)", "raft entry pickle", "raft entry unpickle",
              "state machine apply (each controller)", "feed encode (once, cached)",
              "feed decode (each broker)", "FeedState.accept (each broker)", "apply_metadata (each broker)")

    async def go() -> None:
        feeds, rms = {}, {}
        for b in (1, 3):
            feeds[b] = FeedState()
            feeds[b].accept({"records": sm.records_since(0, 10 ** 9), "metadata_offset": sm.image.offset})
            rms[b] = ReplicaManager(b, MemoryLogManager())
            await rms[b].apply_metadata(feeds[b].image)
        clock = time.process_time

        async def entry(decide) -> tuple | None:
            cost = dict.fromkeys(stages, 0.0)
            # as ControllerServer.write does (since 66cb662): full collections held while it
            # decides and builds the entry, a large entry frozen
            write_hold = FullCollectionHold() if FullCollectionHold and controller_write_holds else None
            if write_hold is not None:
                write_hold.hold()
            t0 = clock()
            recs = decide(sm.image)
            t1 = clock()
            cost[stages[0]] = t1 - t0
            if not recs:
                if write_hold is not None:
                    write_hold.release(freeze=False)
                return None
            base = sm.image.offset
            e = {"request_id": None, "controller_epoch": sm.image.controller_epoch,
                 "records": entry_items(recs)}
            t2 = clock()
            if write_hold is not None:
                write_hold.release(freeze=len(recs) >= GC_FREEZE_MIN_RECORDS_DEFAULT)
            cost[stages[1]] = t2 - t1
            data = _pickle.dumps(e)
            t3 = clock()
            # as raft/syncobj_log.py does (since e645040): a large command is unpickled and
            # applied inside the state machine's hold
            command_hold = (sm.large_command_hold() if hasattr(sm, "large_command_hold")
                            and len(data) >= 64 * 1024 else contextlib.nullcontext())
            with command_hold:
                t3 = clock()
                e = _pickle.loads(data)
                t4 = clock()
                r = sm.apply([e])[0]
                t5 = clock()
            assert r["ok"], r
            cost[stages[2]], cost[stages[3]], cost[stages[4]] = t3 - t2, t4 - t3, t5 - t4
            pages, off = [], base
            while off < sm.image.offset:
                texts, end, ends = sm.feed_page(off, 5000, runs=True)
                off = min(off + 5000, end)
                pages.append(feed_page_text(sm.image.cluster_id, texts, end, ends))
            cost[stages[5]] = clock() - t5
            for b in (1, 3):
                ch = None
                # as MetadataFollower does from the first page of a large change on
                hold = FullCollectionHold() if FullCollectionHold and len(recs) >= GC_FREEZE_MIN_RECORDS_DEFAULT else None
                for text in pages:
                    t6 = clock()
                    body = _json.loads(text)
                    if hold is not None:
                        hold.hold()
                    t7 = clock()
                    ch = feeds[b].accept(body) or ch
                    t8 = clock()
                    cost[stages[6]] += (t7 - t6) / 2
                    cost[stages[7]] += (t8 - t7) / 2
                t9 = clock()
                await rms[b].apply_metadata(ch.image, ch.records)
                if hold is not None:
                    hold.release(freeze=True)
                cost[stages[8]] += (clock() - t9) / 2
            return cost, len(recs)

        def writable() -> bool:
            def leads(b: int, k: tuple) -> bool:
                part = rms[b].partitions.get(k)
                return part is not None and part.is_leader
            return all(leads(1, k) or leads(3, k) for k in led)
        crit = None
        total = dict.fromkeys(stages, 0.0)
        full_gcs[:2] = [0, 0.0]
        crit_gcs = None
        entries = []
        decide = lambda img: c.fence_broker(img, 2)   # noqa: E731
        while True:
            res = await entry(decide)
            if res is None:
                break
            for k, v in res[0].items():
                total[k] += v
            entries.append(res[1])
            if crit is None and writable():
                crit = dict(total)
                crit_gcs = list(full_gcs[:2])
            decide = lambda img: c.maintenance(img, 0)   # noqa: E731 - the follow-up entries
        row(f"{n} partitions, {len(led)} led by the fenced broker: entries (records)", " + ".join(map(str, entries)))
        row("stage: CPU ms critical path / all entries", "")
        for k in stages:
            row(f"  {k}", f"{'-' if crit is None else f'{crit[k] * 1000:.0f}'} / {total[k] * 1000:.0f}")
        row("  one chain (a record through every stage once)",
            f"{'not reached' if crit is None else f'{sum(crit.values()) * 1000:.0f}'} / {sum(total.values()) * 1000:.0f}")
        row("  metadata path without decide / apply_metadata", (
            f"{'-' if crit is None else f'{(sum(crit.values()) - crit[stages[0]] - crit[stages[8]]) * 1000:.0f}'} / "
            f"{(sum(total.values()) - total[stages[0]] - total[stages[8]]) * 1000:.0f}"))
        row("  full collections in the stages above (count, CPU ms)",
            f"{'-' if crit_gcs is None else f'{crit_gcs[0]}, {crit_gcs[1] * 1000:.0f}'} / "
            f"{full_gcs[0]}, {full_gcs[1] * 1000:.0f}")
    asyncio.run(go())
    gc.callbacks.remove(on_gc)
    gc.unfreeze()


def main(argv: list | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--partitions", type=int, default=10_000, help="partitions per topic")
    ap.add_argument("--topics", type=int, default=1, help="topics created in turn")
    ap.add_argument("--rf", type=int, default=3)
    ap.add_argument("--controllers", type=int, default=3, help="3: as cluster up --nodes 3")
    ap.add_argument("--acks", default="all", choices=("all", "1"), help="acks of the writability produce")
    ap.add_argument("--idle-seconds", type=float, default=10.0, help="idle CPU measured this long after each topic")
    ap.add_argument("--writable-seconds", type=float, default=300.0, help="give up on writability after this")
    ap.add_argument("--no-kill", action="store_true", help="skip the kill -9 part")
    ap.add_argument("--profile-kill", type=float, default=0.0, metavar="SECONDS",
                    help="py-spy the survivors and the active controller this long after the kill (needs --keep)")
    ap.add_argument("--controller-args", metavar="ARGS", default="",
                    help="extra command-line options for each controller, e.g. "
                         "'--raft-min-timeout-s 1 --raft-max-timeout-s 2 --log-level INFO'")
    ap.add_argument("--keep", metavar="DIR", help="run in DIR and keep it (broker logs for a post-mortem)")
    ap.add_argument("--log-layer", type=int, metavar="N", help="measure N logs in-process instead (no cluster)")
    ap.add_argument("--fetch-poll", type=int, metavar="N", help="measure the leader's CPU per follower poll "
                    "for N partitions in-process instead (sessionless vs fetch session)")
    ap.add_argument("--rounds", type=int, default=30, help="--fetch-poll rounds")
    ap.add_argument("--failover-pipeline", type=int, metavar="N", help="measure the metadata side of a kill -9 "
                    "at N partitions in-process instead (CPU until the partitions it led have new leaders)")
    args = ap.parse_args(argv)
    if args.profile_kill and not args.keep:
        ap.error("--profile-kill writes its py-spy profiles into the run's directory: add --keep DIR")
    if args.failover_pipeline:
        failover_pipeline(args.failover_pipeline)
        return
    if args.fetch_poll:
        fetch_poll(args.fetch_poll, args.rounds)
        return
    if args.log_layer:
        with tempfile.TemporaryDirectory(prefix="kraftlog-logs-", dir=args.keep) as d:
            log_layer(args.log_layer, d)
        return
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
        run(args.partitions, args.topics, args.rf, args.keep, args.controllers, args.acks, not args.no_kill,
            args.idle_seconds, args.writable_seconds, args.profile_kill, shlex.split(args.controller_args))
        return
    with tempfile.TemporaryDirectory(prefix="kraftlog-scale-") as d:
        run(args.partitions, args.topics, args.rf, d, args.controllers, args.acks, not args.no_kill,
            args.idle_seconds, args.writable_seconds, controller_args=shlex.split(args.controller_args))


if __name__ == "__main__":
    main()
