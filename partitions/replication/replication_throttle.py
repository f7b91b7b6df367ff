"""The replication throttle of partition reassignment (Kafka's replication quotas, KIP-73).

A reassignment may set a cluster-wide rate in bytes/s (broker configs
`leader.replication.throttled.rate` / `follower.replication.throttled.rate` of the default
resource ""; metadata_quorum/reassignment.py). It applies only to *throttled replicas*: the
adding replicas of a running move that are not in the ISR yet, i.e. the copy of a new
replica. Replication of in-sync followers is never slowed, so acks=all produce latency does
not depend on the throttle.

- leader side: a replica fetch of a throttled replica reads at most what the leader's
  bucket holds (nothing while it is empty: the partition answers no data and the follower
  asks again);
- follower side: a broker copying as a throttled replica leaves those partitions out of its
  fetch requests while its bucket is empty.

Each side is a token bucket filled at the rate, holding at most `burst_s` of it; a read may
overdraw it by one batch (reads return whole batches), which the next refills pay back, so
the rate holds on average. The throttle follows the metadata image: it disappears with the
config, i.e. when the last move ends. Pure (the time is passed in).
"""
from __future__ import annotations

import math
import weakref
from typing import Any, Optional

LEADER_RATE_KEY = "leader.replication.throttled.rate"
FOLLOWER_RATE_KEY = "follower.replication.throttled.rate"
CLUSTER_DEFAULT = ""


class TokenBucket:
    """Bytes that may be sent now at `rate` bytes/s (at most `burst_s` worth saved up;
    negative after an overdraw)."""

    def __init__(self, burst_s: float = 0.5) -> None:
        self.burst_s = burst_s
        self.rate: Optional[int] = None
        self.tokens = 0.0
        self.last_ms: Optional[int] = None

    def set_rate(self, rate: Optional[int], now_ms: int) -> None:
        if rate != self.rate:
            self.rate = rate
            self.tokens = 0.0
            self.last_ms = now_ms

    def _refill(self, now_ms: int) -> None:
        if self.rate is None:
            return
        if self.last_ms is None:
            self.last_ms = now_ms
        elapsed = max(0, now_ms - self.last_ms) / 1000
        self.last_ms = now_ms
        self.tokens = min(self.rate * self.burst_s, self.tokens + self.rate * elapsed)

    def available(self, now_ms: int) -> int:
        """Bytes allowed now (0 while overdrawn or empty)."""
        self._refill(now_ms)
        return max(0, int(self.tokens))

    def consume(self, n: int, now_ms: int) -> None:
        self._refill(now_ms)
        self.tokens -= n

    def wait_ms(self, now_ms: int) -> int:
        """How long until some bytes are allowed again."""
        self._refill(now_ms)
        if self.rate is None or self.tokens >= 1:
            return 0
        return math.ceil((1 - self.tokens) * 1000 / self.rate)


def _rate(configs: dict, key: str) -> Optional[int]:
    raw = configs.get(key)
    try:
        value = int(raw) if raw is not None else None
    except ValueError:
        return None
    return value if value is not None and value > 0 else None


class ReplicationThrottle:
    """One broker's leader-side and follower-side buckets, and which replicas they apply to
    (derived from the current metadata image; see the module docstring)."""

    def __init__(self, broker_id: int, burst_s: float = 0.5) -> None:
        self.broker_id = broker_id
        self.leader = TokenBucket(burst_s)
        self.follower = TokenBucket(burst_s)
        self._offset: Optional[int] = None
        self._image_ref: Optional[weakref.ref] = None   # the image last followed (a weak reference:
        # an id() could be reused by a later image once the old one is freed)
        # (topic, partition) -> the adding replicas outside the ISR
        self.throttled: dict[tuple[str, int], frozenset] = {}

    def update(self, image: Any, now_ms: int) -> None:
        """Follow `image` (a MetadataImage; None: no throttle). Cheap when unchanged."""
        if image is None:
            self.throttled = {}
            self.leader.set_rate(None, now_ms)
            self.follower.set_rate(None, now_ms)
            return
        if self._image_ref is not None and self._image_ref() is image and image.offset == self._offset:
            return
        self._image_ref, self._offset = weakref.ref(image), image.offset
        configs = image.broker_configs.get(CLUSTER_DEFAULT, {})
        self.leader.set_rate(_rate(configs, LEADER_RATE_KEY), now_ms)
        self.follower.set_rate(_rate(configs, FOLLOWER_RATE_KEY), now_ms)
        throttled = {}
        if self.leader.rate is not None or self.follower.rate is not None:
            for name, p in image.reassignments():
                catching_up = frozenset(r for r in p.adding_replicas if r not in p.isr)
                if catching_up:
                    throttled[(name, p.partition)] = catching_up
        self.throttled = throttled

    def leader_limit(self, topic: str, partition: int, replica_id: int, now_ms: int) -> Optional[int]:
        """Bytes the leader may send `replica_id` for this partition now; None: not throttled."""
        if self.leader.rate is None or replica_id not in self.throttled.get((topic, partition), ()):
            return None
        return self.leader.available(now_ms)

    def leader_sent(self, n: int, now_ms: int) -> None:
        self.leader.consume(n, now_ms)

    def follower_throttled(self, topic: str, partition: int) -> bool:
        return self.follower.rate is not None and self.broker_id in self.throttled.get((topic, partition), ())

    def follower_received(self, n: int, now_ms: int) -> None:
        self.follower.consume(n, now_ms)
