"""`[remote_storage]`: a broker's tiered storage settings (API.md, Tiered storage). Pure.

Credentials: `s3_access_key_id` / `s3_secret_access_key` here, or (when empty)
`$AWS_ACCESS_KEY_ID` / `$AWS_SECRET_ACCESS_KEY` as boto3 reads them. A TOML `[remote_storage]`
table's keys (`enable`, `s3_endpoint`, ...) are these settings without the
`remote_storage_` prefix (deploy/config.py).
"""
from __future__ import annotations

from dataclasses import dataclass

MiB = 1 << 20


@dataclass(frozen=True)
class RemoteStorageConfig:
    """Named limits of the remote log manager (partitions/log/remote/remote_log_manager.py)."""

    remote_storage_enable: bool = False
    remote_storage_s3_endpoint: str | None = None       # e.g. http://127.0.0.1:8333 (None: AWS)
    remote_storage_s3_bucket: str = "kraftlog-tiered"   # created on start when missing
    remote_storage_s3_region: str = "us-east-1"
    remote_storage_s3_access_key_id: str | None = None  # None: $AWS_ACCESS_KEY_ID
    remote_storage_s3_secret_access_key: str | None = None  # None: $AWS_SECRET_ACCESS_KEY
    remote_storage_s3_prefix: str = ""                  # key prefix (several clusters, one bucket)
    remote_storage_request_timeout_ms: int = 5_000      # connect + read timeout of one store request
    remote_log_manager_task_interval_ms: int = 1_000    # copier / remote retention pass (Kafka: 30 s)
    remote_log_copy_backoff_max_ms: int = 10_000        # retries of a failed copy back off up to this
    remote_fetch_threads: int = 2                       # remote reads run here, never on the event loop
    remote_fetch_max_wait_ms: int = 10_000              # a remote read slower than this fails the fetch (retriable)
    remote_index_cache_entries: int = 1_024             # offset indexes of remote segments kept in memory
    remote_fetch_chunk_bytes: int = 1 * MiB             # range reads are whole chunks of this size
    remote_fetch_cache_max_bytes: int = 256 * MiB       # on-disk chunk cache bound (under the state dir)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        for n in ("remote_storage_request_timeout_ms", "remote_log_manager_task_interval_ms",
                  "remote_log_copy_backoff_max_ms", "remote_fetch_threads", "remote_fetch_max_wait_ms",
                  "remote_index_cache_entries", "remote_fetch_chunk_bytes"):
            v = getattr(self, n)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"{n} must be > 0, got {v!r}; fix {n} in the config ([remote_storage])")
        if self.remote_fetch_cache_max_bytes < self.remote_fetch_chunk_bytes:
            raise ValueError(f"remote_fetch_cache_max_bytes must be >= remote_fetch_chunk_bytes "
                             f"({self.remote_fetch_chunk_bytes}), got {self.remote_fetch_cache_max_bytes!r}")
        if self.remote_storage_enable and not self.remote_storage_s3_bucket:
            raise ValueError("remote_storage_s3_bucket is empty; name the bucket in [remote_storage] s3_bucket")


__all__ = ["RemoteStorageConfig"]
