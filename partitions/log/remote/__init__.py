"""Tiered storage (KIP-405): closed segments of `remote.storage.enable` topics in a remote
object store, a short local tail, reads that do not care where the data is.

- `metadata`: `RemoteLogSegmentMetadata` (one remote segment, its offsets, epochs and
  state) and `RemoteLogSegments` (a partition's remote segments: lookup, log start, the
  total-retention plan). Pure.
- `storage`: the `RemoteStorageManager` / `RemoteLogMetadataManager` protocols and
  `LogSegmentData` (the files of one segment). Pure.
- `config`: the broker's `[remote_storage]` settings (`RemoteStorageConfig`). Pure.
- `chunk_cache`: the bounded on-disk cache of remote byte ranges (file IO only).
- `s3` (shell): both protocols on an S3-compatible store with boto3.
- `remote_log_manager` (shell): the leader's copier, remote retention, remote reads,
  metrics (threads; never the event loop).
See docs/TIERED_STORAGE.md.
"""
