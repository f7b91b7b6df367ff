"""Free TCP ports for processes started later (local clusters, tests, benchmarks).

A port found by binding to port 0 comes from the kernel's ephemeral range
(`net.ipv4.ip_local_port_range`, 32768-60999 by default), the same range outgoing
connections draw their local ports from. Between the moment such a port is chosen and the
moment the child process binds it, any outgoing connection on the machine may take it (one
CI run lost a controller that way: SeaweedFS's own gRPC connections took the port chosen
for its HTTP listener, "address already in use"). The ports handed out here come from
outside that range, so no outgoing connection can take them; each is checked free by
binding it, and one process never hands out the same port twice.
"""
from __future__ import annotations

import random
import socket
import threading

EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
LOWEST_PORT = 10000          # below: well-known and registered services' habits
ATTEMPTS_MAX = 2000

_handed_out: set[int] = set()
_lock = threading.Lock()


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections' local ports (Linux default if unknown)."""
    try:
        with open(EPHEMERAL_RANGE_FILE) as f:
            low, high = (int(x) for x in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def candidate_ranges() -> list[range]:
    low, high = ephemeral_range()
    return [r for r in (range(LOWEST_PORT, low), range(high + 1, 65536)) if len(r) > 0]


def _bindable(port: int, host: str) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _kernel_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, outside the ephemeral range, not handed out before
    by this process. Falls back to a kernel-chosen port if the machine's ephemeral range
    leaves no room."""
    ranges = candidate_ranges()
    with _lock:
        if ranges:
            for _ in range(ATTEMPTS_MAX):
                r = random.choice(ranges)
                port = random.randrange(r.start, r.stop)
                if port not in _handed_out and _bindable(port, host):
                    _handed_out.add(port)
                    return port
        port = _kernel_port(host)
        _handed_out.add(port)
        return port


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """`n` distinct free ports (see free_port)."""
    return [free_port(host) for _ in range(n)]
