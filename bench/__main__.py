"""`python -m bench` (make bench): run every bench/*_bench.py module's main() in turn."""
from __future__ import annotations

import importlib
import inspect
import os
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def main() -> int:
    names = sorted(f[:-3] for f in os.listdir(HERE) if f.endswith("_bench.py"))
    if not names:
        print("no bench/*_bench.py modules found")
        return 0
    failed = []
    for name in names:
        print(f"=== bench.{name} ===", flush=True)
        try:
            mod = importlib.import_module(f"bench.{name}")
            fn = getattr(mod, "main", None)
            if fn is None:
                print(f"bench.{name} has no main(); skipped")
                continue
            # main(argv) when it takes arguments (so it ignores `python -m bench`'s own), else main()
            fn([]) if inspect.signature(fn).parameters else fn()
        except SystemExit as e:
            if e.code not in (0, None):
                failed.append(name)
        except Exception:
            traceback.print_exc()
            failed.append(name)
    if failed:
        print(f"benchmarks that failed: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
