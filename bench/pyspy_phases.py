"""Where a process's time went, second by second after a kill -9.

`partitions_scale_bench --profile-kill S --keep DIR` records each survivor and the active
controller with py-spy for S seconds, one recording per second (`DIR/pyspy-<name>-<k>.txt`,
raw collapsed stacks, GIL-idle frames left out, 50 samples a second). This prints, for each
second, how busy the process was (samples / 50) and the frames that took the largest share
of it, inclusive:

    python -m bench.pyspy_phases DIR/pyspy-broker-2 --top 8
    python -m bench.pyspy_phases DIR/pyspy-broker-2 --match produce.py   # frames of one file
"""
from __future__ import annotations

import argparse
import glob
from collections import Counter

RATE_HZ = 50   # partitions_scale_bench's py-spy --rate

# frames every event-loop stack has: not worth a line
_NOISE = ("_run_module_as_main", "_run_code", "<module>", "main (", "run_broker", "run (uvloop", "Runner.run",
          "run_controller", "run_forever", "run_until_complete", "_run_once", "Handle._run", "Thread._bootstrap",
          "Thread.run", "run (asyncio")


def second(path: str, match: str = "") -> tuple:
    """(samples, Counter of frame -> samples that include it) of one recording."""
    total = 0
    incl: Counter = Counter()
    with open(path) as f:
        for line in f:
            stack, _, n = line.rstrip().rpartition(" ")
            if not stack or not n.isdigit():
                continue
            total += int(n)
            for frame in set(stack.split(";")):
                if match in frame and not frame.startswith(_NOISE):
                    incl[frame] += int(n)
    return total, incl


def main(argv: list | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("prefix", help="DIR/pyspy-<name> (the recordings are <prefix>-<second>.txt)")
    ap.add_argument("--top", type=int, default=8, help="frames shown per second")
    ap.add_argument("--match", default="", help="only frames whose text contains this")
    args = ap.parse_args(argv)
    for path in sorted(glob.glob(f"{args.prefix}-[0-9]*.txt")):
        k = path.rsplit("-", 1)[1].split(".")[0]
        total, incl = second(path, args.match)
        print(f"+{int(k):2d} s  busy {total / RATE_HZ:4.2f}")
        for frame, n in incl.most_common(args.top):
            print(f"        {n / RATE_HZ:4.2f}  {frame[:150]}")


if __name__ == "__main__":
    main()
