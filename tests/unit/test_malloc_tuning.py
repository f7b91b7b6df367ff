"""http_api.broker.malloc_tuning: large short-lived buffers stop page-faulting once applied."""
import subprocess
import sys

from http_api.broker import malloc_tuning
from http_api.broker.config import BrokerConfig

CHURN = r"""
import resource, sys
from http_api.broker import malloc_tuning
if sys.argv[1] == "tuned":
    assert malloc_tuning.apply(64 << 20, 256 << 20) == {"mmap_threshold_bytes": 64 << 20,
                                                        "trim_threshold_bytes": 256 << 20}
src = bytearray(b"x" * 1_000_000)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(200):          # like a broker: a few 1 MB buffers per request, dropped after
    bufs = [bytes(src) for _ in range(3)]
    del bufs
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    env = {"PATH": "/usr/bin:/bin"}   # no MALLOC_* variables from the caller
    out = subprocess.run([sys.executable, "-c", CHURN, mode], capture_output=True, text=True, env=env,
                         cwd=".", check=True)
    return int(out.stdout.strip())


def test_tuning_removes_page_faults_of_buffer_churn():
    plain, tuned = _faults("plain"), _faults("tuned")
    # glibc default: the heap is trimmed after each burst, so every burst faults its pages anew
    assert plain > 200 * 100, plain
    assert tuned < plain / 20, (plain, tuned)


def test_zero_keeps_glibc_defaults():
    assert malloc_tuning.apply(0, 0) == {}


def test_broker_config_has_named_defaults():
    c = BrokerConfig()
    assert c.malloc_mmap_threshold_bytes == 64 * 1024 * 1024
    assert c.malloc_trim_threshold_bytes == 256 * 1024 * 1024
