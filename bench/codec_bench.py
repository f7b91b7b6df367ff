"""Record batch codec benchmark: `python -m bench.codec_bench [--records 1000] [--value-bytes 100]`.

Prints the cost of encoding and decoding one batch of N records (kraftlog's columnar
records section, per compression codec) next to cbor2 (a list of dicts, the design
guide's reference) measured in the same run, plus the broker's per-batch work
(validate = header parse + CRC-32C; stamp = in-place offset/epoch). Not asserted.
"""
from __future__ import annotations

import argparse
import os
import time

from partitions.log.record_batch import (
    Compression,
    Record,
    build_batch,
    decode_records,
    stamp_batch,
    validate_batch,
)


def best_us(fn, *, repeat: int = 7, number: int = 50) -> float:
    """Best of `repeat` runs of `number` calls, in microseconds per call (noise-robust)."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - t0) / number)
    return best * 1e6


def row(name: str, *cols: str) -> None:
    print(f"| {name:<44} | " + " | ".join(f"{c:>12}" for c in cols) + " |")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--records", type=int, default=1000)
    ap.add_argument("--value-bytes", type=int, default=100)
    args = ap.parse_args(argv)
    n, size = args.records, args.value_bytes
    # semi-compressible values: random prefix, repeated tail
    values = [os.urandom(size // 2) + b"a" * (size - size // 2) for _ in range(n)]
    records = [Record(None, v, timestamp=1_700_000_000_000 + i) for i, v in enumerate(values)]
    keyed = [Record(b"key-%d" % (i % 64), v, headers=(("trace", b"abc"),), timestamp=1_700_000_000_000 + i)
             for i, v in enumerate(values)]

    print(f"\nrecord batch codec: {n} records x {size} B values (best of 7, us per batch)\n")
    row("case", "encode us", "decode us", "total us", "batch bytes")
    row("-" * 44, *["-" * 12] * 4)
    base_total = None
    try:
        import cbor2

        dicts = [{"key": r.key, "value": r.value, "timestamp": r.timestamp, "headers": []} for r in records]
        enc = best_us(lambda: cbor2.dumps([{"key": r.key, "value": r.value, "timestamp": r.timestamp,
                                            "headers": list(r.headers)} for r in records]))
        blob = cbor2.dumps(dicts)
        dec = best_us(lambda: cbor2.loads(blob))
        base_total = enc + dec
        row("cbor2 list of dicts (reference)", f"{enc:.0f}", f"{dec:.0f}", f"{enc + dec:.0f}", str(len(blob)))
    except ImportError:  # pragma: no cover
        pass
    results = {}
    for codec in Compression:
        batch = build_batch(records, compression=codec)
        enc = best_us(lambda: build_batch(records, compression=codec))
        dec = best_us(lambda: decode_records(batch))
        results[codec] = enc + dec
        row(f"kraftlog batch, {codec.name.lower()}", f"{enc:.0f}", f"{dec:.0f}", f"{enc + dec:.0f}", str(len(batch)))
    batch = build_batch(keyed)
    enc = best_us(lambda: build_batch(keyed))
    dec = best_us(lambda: decode_records(batch))
    row("kraftlog batch, keys + 1 header each", f"{enc:.0f}", f"{dec:.0f}", f"{enc + dec:.0f}", str(len(batch)))

    big = bytearray(build_batch(records))
    val = best_us(lambda: validate_batch(big), number=500)
    stamp = best_us(lambda: stamp_batch(big, 12345, 7), number=2000)
    print()
    row("broker work per batch", "us", "GB/s", "", "")
    row("-" * 44, *["-" * 12] * 4)
    row(f"validate_batch (header + CRC-32C, {len(big)} B)", f"{val:.1f}", f"{len(big) / val / 1e3:.2f}", "", "")
    row("stamp_batch (offset + epoch in place)", f"{stamp:.2f}", "", "", "")
    if base_total:
        print(f"\nratio kraftlog(none) encode+decode / cbor2: {results[Compression.NONE] / base_total:.2f}")


if __name__ == "__main__":
    main()
