"""A short seeded schedule of real-process faults (every nemesis kind once) against a
3-node cluster with an RF=3, min.insync.replicas=2, acks=all workload (plain and
idempotent producers, consumers, group commits, a compacted topic with overwritten keys and
tombstones), the log cleaner on (small segments, low dirty ratio, short
delete.retention.ms; `__consumer_offsets` compacted too). The history must check clean,
and the cleaner must have done real work meanwhile (passes that removed records, on the
compacted topic and on `__consumer_offsets`).

Seed: KRAFTLOG_CHAOS_SEED (default fixed); the report of a failing run is written under
the pytest tmp dir (path in the failure message). Long runs: python -m tests.chaos.run.
"""
from __future__ import annotations

import glob
import os
import shutil
import tempfile
import time

import pytest

from tests.chaos.harness.nemesis import ALL_NEMESES
from tests.chaos.run import run_chaos

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(280)]

SEED = int(os.environ.get("KRAFTLOG_CHAOS_SEED", "20261122"))
# one fault at a time, each waited for at most this long (a cluster that does not settle
# costs at most 18 x 8 s here, inside the timeout; the log names what was missing)
SETTLE_MAX_S = 8.0
# each fault held longer than the fencing from fetch silence takes (broker_silence_fence_ms,
# 1.5 s), so that path is exercised; the quiet time after a settled heal kept short (the
# settle wait, not the quiet time, is what keeps two faults from adding up)
HOLD_S = (1.6, 2.0)
QUIET_S = (0.6, 1.0)


async def test_short_fault_schedule_keeps_every_acknowledged_write(tmp_path):
    await run_short_schedule(tmp_path, list(ALL_NEMESES))


async def run_short_schedule(tmp_path, kinds: list, *, secure: bool = False, hold_s=HOLD_S,
                             quiet_s=QUIET_S) -> dict:
    """Run one fault of each of `kinds` and assert the history checks clean, the faults were
    felt and the cleaner worked (shared by test_short_schedule_secure.py); -> the figures."""
    out = tmp_path / "report"
    lines = []
    figs, result = await run_chaos(str(tmp_path / "cluster"), SEED, fault_count=len(kinds), kinds=kinds,
                                   hold_s=hold_s, quiet_s=quiet_s, warmup_s=1.5, out_dir=str(out),
                                   log=lines.append, secure=secure, settle_max_s=SETTLE_MAX_S)
    where = f"seed {SEED}; secure {secure}; report {out}/report.md; log:\n" + "\n".join(lines)
    if not result.valid:  # keep the evidence: pytest's tmp dirs rotate
        keep = os.path.join(tempfile.gettempdir(), "kraftlog-chaos-failures",
                            f"seed-{SEED}{'-secure' if secure else ''}-{int(time.time())}")
        shutil.copytree(out, os.path.join(keep, "report"))
        for path in glob.glob(str(tmp_path / "cluster" / "node-*" / "*.log")):
            dest = os.path.join(keep, os.path.relpath(path, tmp_path / "cluster"))
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            shutil.copy(path, dest)
        where += f"\nreport and process logs kept in {keep}"
    assert result.valid, result.summary() + "\n" + where
    faults = figs["_faults"]
    assert sorted(f.kind for f in faults) == sorted(kinds), where
    assert not figs["fault_errors"], where
    ops = figs["operations"]
    assert ops.get("produce:ok", 0) > 200 and ops.get("fetch:ok", 0) > 200, where
    assert ops.get("commit:ok", 0) > 5 and ops.get("read_committed:ok", 0) > 5, where
    # the faults were felt: some operations failed or had unknown outcomes
    assert sum(v for k, v in ops.items() if k.endswith((":fail", ":info"))) > 0, where
    assert (out / "throughput_latency.svg").exists() and (out / "history.jsonl").exists()
    # compaction under faults: acknowledged writes of the compacted topic, checked per key.
    # Whether the final read shows superseded writes removed depends on which replica leads
    # at the end (a replica that caught up after a restart holds its copy in one active
    # segment, which is never cleaned, as in Kafka): a figure, not a condition; that the
    # cleaner ran on the compacted topic is asserted below.
    stats = result.stats
    assert stats.get("compacted_keys_checked", 0) > 0, where
    assert sum(1 for op in result_ops(out) if op.f == "read_committed" and op.value.get("final")
               and op.type == "ok") == 3, where
    cleaner = figs["log_cleaner"]
    assert cleaner["passes_total"] > 0 and cleaner["records_removed_total"] > 0, where + f"\ncleaner {cleaner}"
    assert {"chaos-compacted", "__consumer_offsets"} <= set(cleaner["cleaned_logs"]), where + f"\ncleaner {cleaner}"
    print(f"\nshort schedule{' (secure)' if secure else ''}: {figs['meta']['duration_s']} s, checker {stats}, "
          f"proxies {figs['proxy_faults']}\n" + "\n".join(lines))
    return figs


def result_ops(out):
    from tests.chaos.harness.history import History
    return History.load(str(out / "history.jsonl")).ops
