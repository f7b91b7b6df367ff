"""Broker configuration: every limit is named, carries its unit last and has a default."""
from __future__ import annotations

from dataclasses import dataclass, field

MiB = 1024 * 1024


@dataclass
class BrokerConfig:
    """Settings of one broker process (see deploy/config.py for how they are loaded)."""

    broker_id: int = 1
    cluster_id: str = "kraftlog-local"
    http_host: str = "127.0.0.1"
    http_port: int = 8082
    advertised_url: str | None = None          # default http://{http_host}:{http_port}
    rack: str | None = None
    log_dirs: list[str] = field(default_factory=lambda: ["./data/broker-1/logs"])
    state_dir: str = "./data/broker-1"         # group offsets, broker meta
    controller_urls: list[str] = field(default_factory=lambda: ["http://127.0.0.1:9093"])

    # request limits
    max_request_bytes: int = 8 * MiB           # whole HTTP body; 413 RECORD_LIST_TOO_LARGE
    max_records_per_request: int = 100_000     # 413 RECORD_LIST_TOO_LARGE
    max_message_bytes: int = 1 * MiB + 12      # one record batch (Kafka message.max.bytes); 413 MESSAGE_TOO_LARGE
    fetch_max_bytes: int = 8 * MiB             # cap on a fetch's max_bytes
    fetch_default_max_bytes: int = 1 * MiB     # max_bytes when the request has none
    fetch_max_wait_ms: int = 30_000            # cap on a fetch's max_wait_ms
    max_concurrent_long_polls: int = 1024      # waiting fetches at once; 429 THROTTLING_QUOTA_EXCEEDED
    request_timeout_ms: int = 30_000           # acks=all wait bound; forwarded requests
    # topics
    auto_create_topics_enable: bool = True
    num_partitions: int = 1
    default_replication_factor: int = 1
    min_insync_replicas: int = 1
    replica_lag_time_max_ms: int = 30_000
    replica_fetch_wait_max_ms: int = 500       # follower long poll on its leader
    replica_fetch_backoff_ms: int = 200        # after a failed replica fetch
    # process memory (http_api/malloc_tuning.py; 0 keeps glibc's default)
    malloc_mmap_threshold_bytes: int = 64 * MiB    # buffers below this come from the heap, not fresh mmaps
    malloc_trim_threshold_bytes: int = 256 * MiB   # freed heap kept for reuse up to this much
    # background jobs
    log_retention_check_interval_ms: int = 300_000
    offset_checkpoint_interval_ms: int = 60_000
    log_flush_scheduler_interval_ms: int = 1_000  # how often flush.ms policies are checked
    log_cleaner_enable: bool = True            # compaction of cleanup.policy=compact topics (log_scheduler.py)
    log_cleaner_threads: int = 1
    log_cleaner_backoff_ms: int = 15_000       # a cleaner thread with nothing to clean sleeps this long
    log_cleaner_dedupe_buffer_size_bytes: int = 128 * MiB  # key -> offset map of one pass (all threads share it)
    log_cleaner_process: bool = True           # the CPU-heavy part of a pass in a child process (no GIL contention)
    log_cleaner_io_max_bytes_per_second: float = -1  # read + write IO of all cleaner threads together; -1: no limit
    metadata_wait_ms: int = 10_000             # how long admin calls wait for the broker to see their result
    # consumer groups (http_api/group_routes.py; Kafka's offsets.topic.* and group.* settings)
    offsets_topic_num_partitions: int = 10     # __consumer_offsets partitions (fixed once created)
    offsets_topic_replication_factor: int = 3  # capped at the number of live brokers when created
    offsets_commit_timeout_ms: int = 5_000     # acks=all wait for a commit / group change
    group_min_session_timeout_ms: int = 1_000  # joins outside [min, max] get INVALID_SESSION_TIMEOUT
    group_max_session_timeout_ms: int = 300_000
    group_session_timeout_ms: int = 45_000     # session.timeout.ms when the member gives none
    group_heartbeat_interval_ms: int = 3_000   # capped at a third of the member's session timeout
    group_rebalance_timeout_ms: int = 60_000   # a member must revoke within this, else it is removed
    offsets_retention_minutes: int = 10_080    # committed offsets of groups without members kept this long (7 days)
    offsets_retention_check_interval_ms: int = 600_000  # how often expired offsets are looked for
    # the cluster secret (the node config's `password`, passed as $KRAFTLOG_RAFT_PASSWORD, never
    # on the command line): when set, /internal/ routes need its token (http_api/internal_auth.py)
    cluster_secret: str | None = None

    @property
    def url(self) -> str:
        return self.advertised_url or f"http://{self.http_host}:{self.http_port}"
