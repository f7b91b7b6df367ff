"""Tiered storage benchmark: `python -m bench.tiered_bench [--size-mb 64] [--segment-mb 4]`.

Against a real SeaweedFS (S3) on this machine, figures printed (not asserted), same run:
- copy: RemoteLogManager copying every closed segment of a `size-mb` log (segment + both
  indexes + epochs + producer snapshot per segment), MB/s;
- read from offset 0 to the end, 1 MiB fetches: local `Log.read` (baseline) vs
  `RemoteLogManager.read` with a cold chunk cache (every byte from the store by range
  reads) vs warm (chunks on local disk);
- produce through a real broker (1 broker, acks=1, 256 KiB raw batches) to a topic with
  remote.storage.enable=true (copying while producing) vs the same topic config without it
  (goal: within 5%); interleaved rounds, medians.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

MiB = 1 << 20


def row(name: str, value: str, ratio: str = "") -> None:
    print(f"| {name:<58} | {value:>14} | {ratio:>10} |", flush=True)


def make_log(path: Path, size_mb: int, segment_mb: int):
    from partitions.log.config import LogConfig
    from partitions.log.log import Log
    from partitions.log.record_batch import Record, build_batch
    cfg = LogConfig(segment_bytes=segment_mb * MiB, remote_storage_enable=True, retention_ms=-1, preallocate=False)
    lg = Log.open(path, cfg)
    templates = [build_batch([Record(None, os.urandom(100)) for _ in range(2400)]) for _ in range(4)]
    i = 0
    while lg.size_bytes < size_mb * MiB:
        lg.append_as_leader(templates[i % 4], 0)
        i += 1
    lg.roll()
    lg.update_high_watermark(lg.log_end_offset)
    return lg


def bench_log_level(tmp: Path, endpoint: str, size_mb: int, segment_mb: int) -> None:
    from deploy.seaweedfs import ACCESS_KEY_ID, SECRET_ACCESS_KEY
    from partitions.log.remote.config import RemoteStorageConfig
    from partitions.log.remote.remote_log_manager import Leadership, RemoteLogManager
    from partitions.log.remote.s3 import S3RemoteStorage

    lg = make_log(tmp / "bench-0", size_mb, segment_mb)
    cfg = RemoteStorageConfig(remote_storage_enable=True, remote_storage_s3_endpoint=endpoint,
                              remote_storage_s3_bucket="kraftlog-bench", remote_storage_s3_access_key_id=ACCESS_KEY_ID,
                              remote_storage_s3_secret_access_key=SECRET_ACCESS_KEY,
                              remote_storage_request_timeout_ms=30_000, remote_fetch_cache_max_bytes=2 * size_mb * MiB)

    class One:
        def all_logs(self):
            return [lg]

    rlm = RemoteLogManager(cfg, S3RemoteStorage(cfg), One(), 1, tmp / "cache",
                           lambda t, p: Leadership(True, 0, lg.high_watermark, "bench"))
    try:
        size = sum(s.size for s in lg.segments[:-1])
        t0 = time.perf_counter()
        while lg.remote_copied_end_offset < lg.segments[-1].base_offset:
            rlm.run_once()
        copy_s = time.perf_counter() - t0
        row(f"copy {size / MiB:.0f} MB ({len(lg.segments) - 1} segments of {segment_mb} MiB)",
            f"{size / MiB / copy_s:.1f} MB/s")

        def read_local() -> int:
            off, n = 0, 0
            while off < lg.log_end_offset:
                r = lg.read(off, MiB)
                n += len(r.records)
                off = r.next_offset
            return n

        def read_remote() -> int:
            off, n = 0, 0
            while off < lg.log_end_offset:
                r = rlm.read(lg.topic, lg.partition, off, MiB)
                n += len(r.records)
                off = r.next_offset
            return n

        t0 = time.perf_counter()
        n_local = read_local()
        local_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        n_cold = read_remote()
        cold_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        n_warm = read_remote()
        warm_s = time.perf_counter() - t0
        assert n_local == n_cold == n_warm, (n_local, n_cold, n_warm)
        local_rate = n_local / MiB / local_s
        row("read from 0: local Log.read (baseline)", f"{local_rate:.0f} MB/s", "1.00")
        row("read from 0: remote, cold chunk cache (S3 range reads)", f"{n_cold / MiB / cold_s:.0f} MB/s",
            f"{(n_cold / cold_s) / (n_local / local_s):.2f}")
        row("read from 0: remote, warm chunk cache (local chunk files)", f"{n_warm / MiB / warm_s:.0f} MB/s",
            f"{(n_warm / warm_s) / (n_local / local_s):.2f}")
    finally:
        rlm.stop()
        lg.close()


def bench_produce(tmp: Path, store, rounds: int, mb_per_round: int) -> None:
    from http_api.wire.codecs import RAW_BATCH
    from partitions.log.record_batch import Record, build_batch
    from tests.rigs.cluster import ReplicatedCluster, http

    settings = {**store.broker_settings("kraftlog-bench-produce"), "log_cleaner_enable": False,
                "remote_log_manager_task_interval_ms": 1000, "remote_storage_request_timeout_ms": 30_000}
    body = build_batch([Record(None, os.urandom(100)) for _ in range(2400)])
    n = mb_per_round * MiB // len(body)
    with ReplicatedCluster(str(tmp / "cluster"), brokers=1, broker_config=settings) as cluster:
        url = cluster.url(1)
        base = {"segment.bytes": str(4 * MiB), "retention.ms": "-1"}
        cluster.create_topic("plain", replication_factor=1, configs=base)
        cluster.create_topic("tiered", replication_factor=1,
                             configs={**base, "remote.storage.enable": "true", "local.retention.bytes": str(16 * MiB)})
        rates: dict[str, list[float]] = {"plain": [], "tiered": []}
        for r in range(rounds):
            for topic in (("plain", "tiered") if r % 2 == 0 else ("tiered", "plain")):   # no order bias
                t0 = time.perf_counter()
                for _ in range(n):
                    status, doc = http("POST", f"{url}/v1/topics/{topic}/partitions/0/records?acks=1",
                                       raw=body, content_type=RAW_BATCH)
                    assert status == 200, doc
                rates[topic].append(n * len(body) / MiB / (time.perf_counter() - t0))
        plain, tiered = statistics.median(rates["plain"]), statistics.median(rates["tiered"])
        row(f"produce acks=1, tiering off (median of {rounds} x {mb_per_round} MB)", f"{plain:.0f} MB/s", "1.00")
        row(f"produce acks=1, tiering on, copying meanwhile", f"{tiered:.0f} MB/s", f"{tiered / plain:.2f}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-mb", type=int, default=64)
    p.add_argument("--segment-mb", type=int, default=4)
    p.add_argument("--produce-rounds", type=int, default=5)
    p.add_argument("--produce-mb", type=int, default=32)
    args = p.parse_args(argv)
    from tests.rigs.seaweedfs import SeaweedStore
    tmp = Path(tempfile.mkdtemp(prefix="tiered-bench-"))
    store = SeaweedStore(str(tmp / "seaweedfs"))
    try:
        store.start()
        print(f"| {'tiered storage (SeaweedFS on this machine)':<58} | {'value':>14} | {'vs base':>10} |")
        print(f"|{'-' * 60}|{'-' * 16}|{'-' * 12}|")
        bench_log_level(tmp, store.endpoint, args.size_mb, args.segment_mb)
        bench_produce(tmp, store, args.produce_rounds, args.produce_mb)
    finally:
        store.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
