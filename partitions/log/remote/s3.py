"""Tiered storage on an S3-compatible object store (AWS S3, SeaweedFS, MinIO...): both
KIP-405 plug points (`RemoteStorageManager`, `RemoteLogMetadataManager`) over boto3.

Why boto3 (in the remote log manager's threads) and not an asyncio client: every caller
here already runs in a worker thread (the copier next to retention, remote reads in their
own pool, so the event loop never waits on the store); boto3 is AWS's own SDK (signing,
retries, path/virtual addressing, endpoints) and its clients are thread-safe;
aiobotocore would pin botocore to its own releases and still need the segment file reads
off the loop. Requests are bounded by `remote_storage_request_timeout_ms` with no SDK
retries: the copier owns the retry policy (backoff while the store is down).

Object layout, under `[remote_storage] s3_prefix` (topic id in the path: a topic deleted
and re-created under the same name never sees the old data):

    <topic>-<topic_id>/<partition>/<base:020d>-<segment_id>.{log,index,timeindex,leader-epoch-checkpoint,snapshot}
    <topic>-<topic_id>/<partition>/_metadata/<segment_id>.<state>.json   RemoteLogSegmentMetadata
    <topic>-<topic_id>/<partition>/_log_start/<offset:020d>              DeleteRecords floor (empty)

Every state of a segment is its own object, written once and never overwritten:
`.started.json` (COPY_SEGMENT_STARTED) before the data, `.finished.json` after it,
`.deleting.json` (DELETE_SEGMENT_STARTED) before the data goes; DELETE_SEGMENT_FINISHED
removes them all. A segment's state is the most advanced object the listing shows, so a
listing shows every upload a dead leader started (see docs/TIERED_STORAGE.md for why the
metadata lives next to the data). Why no overwrite: a SeaweedFS under load answered a GET of
an overwritten object with its previous content seconds after the overwrite (a FINISHED
segment read back as COPY_SEGMENT_STARTED, i.e. as an orphan to delete); an object written
once has no older content to return.
"""
from __future__ import annotations

import logging
import os
import threading

import boto3
from botocore.config import Config as BotoConfig
from botocore.exceptions import BotoCoreError, ClientError

from .config import RemoteStorageConfig
from .metadata import RemoteLogSegmentMetadata
from .storage import LogSegmentData, RemoteResourceNotFoundError, RemoteStorageError

log = logging.getLogger(__name__)

METADATA_DIR = "_metadata"
LOG_START_DIR = "_log_start"   # DeleteRecords floors: <partition>/_log_start/<offset:020d>
# state -> key suffix, in the order a segment moves through them (later wins in a listing)
_STATE_SUFFIXES = {"COPY_SEGMENT_STARTED": "started", "COPY_SEGMENT_FINISHED": "finished",
                   "DELETE_SEGMENT_STARTED": "deleting"}
_SUFFIX_RANK = {suffix: rank for rank, suffix in enumerate(_STATE_SUFFIXES.values())}


def parse_metadata_key(key: str) -> tuple[str, int] | None:
    """`.../_metadata/<segment_id>.<state>.json` -> (segment id, rank of the state); a legacy
    `<segment_id>.json` (one object rewritten per state) ranks lowest; None for other keys."""
    name = key.rsplit("/", 1)[-1]
    if not name.endswith(".json"):
        return None
    parts = name[:-5].split(".")
    if len(parts) == 1:
        return parts[0], -1
    if len(parts) == 2 and parts[1] in _SUFFIX_RANK:
        return parts[0], _SUFFIX_RANK[parts[1]]
    return None


def _missing(exc: ClientError) -> bool:
    code = str(exc.response.get("Error", {}).get("Code", ""))
    return code in ("404", "NoSuchKey", "NotFound", "NoSuchBucket")


class S3RemoteStorage:
    """`RemoteStorageManager` + `RemoteLogMetadataManager` on one S3 bucket (thread-safe)."""

    def __init__(self, cfg: RemoteStorageConfig) -> None:
        self.cfg = cfg
        self.bucket = cfg.remote_storage_s3_bucket
        self.prefix = cfg.remote_storage_s3_prefix.strip("/")
        if self.prefix:
            self.prefix += "/"
        timeout = cfg.remote_storage_request_timeout_ms / 1000
        session = boto3.session.Session(
            aws_access_key_id=cfg.remote_storage_s3_access_key_id or os.environ.get("AWS_ACCESS_KEY_ID"),
            aws_secret_access_key=cfg.remote_storage_s3_secret_access_key or os.environ.get("AWS_SECRET_ACCESS_KEY"),
            region_name=cfg.remote_storage_s3_region)
        self.client = session.client(
            "s3", endpoint_url=cfg.remote_storage_s3_endpoint,
            config=BotoConfig(connect_timeout=timeout, read_timeout=timeout, retries={"max_attempts": 1},
                              s3={"addressing_style": "path"}, max_pool_connections=16,
                              signature_version="s3v4"))
        self._bucket_ready = threading.Event()
        # metadata object key -> (ETag, parsed): a re-listing GETs only what changed
        self._metadata_cache: dict[str, tuple[str, RemoteLogSegmentMetadata]] = {}
        self._metadata_lock = threading.Lock()

    # ------------------------------------------------------------------ keys

    def partition_prefix(self, topic: str, topic_id: str, partition: int) -> str:
        return f"{self.prefix}{topic}-{topic_id}/{partition}/"

    def topic_prefix(self, topic: str, topic_id: str) -> str:
        return f"{self.prefix}{topic}-{topic_id}/"

    def data_key(self, md: RemoteLogSegmentMetadata, kind: str) -> str:
        return f"{self.partition_prefix(md.topic, md.topic_id, md.partition)}{md.base_offset:020d}-{md.segment_id}.{kind}"

    def metadata_key(self, md: RemoteLogSegmentMetadata, state: str | None = None) -> str:
        """The object of `md` in `state` (default: its own state; see the module docstring)."""
        suffix = _STATE_SUFFIXES[state or md.state.value]
        return (f"{self.partition_prefix(md.topic, md.topic_id, md.partition)}{METADATA_DIR}/"
                f"{md.segment_id}.{suffix}.json")

    def _all_metadata_keys(self, md: RemoteLogSegmentMetadata) -> list[str]:
        legacy = f"{self.partition_prefix(md.topic, md.topic_id, md.partition)}{METADATA_DIR}/{md.segment_id}.json"
        return [self.metadata_key(md, state) for state in _STATE_SUFFIXES] + [legacy]

    # ------------------------------------------------------------------ plumbing

    def _call(self, what: str, fn, **kwargs):
        try:
            return fn(**kwargs)
        except ClientError as exc:
            if _missing(exc):
                raise RemoteResourceNotFoundError(f"{what}: {exc}") from exc
            raise RemoteStorageError(f"{what}: {exc}") from exc
        except (BotoCoreError, OSError) as exc:
            raise RemoteStorageError(f"{what}: {exc}") from exc

    def ensure_bucket(self) -> None:
        """Create the bucket when missing (once per process, retried by callers until it works)."""
        if self._bucket_ready.is_set():
            return
        try:
            self._call("head bucket", self.client.head_bucket, Bucket=self.bucket)
        except RemoteResourceNotFoundError:
            try:
                self._call("create bucket", self.client.create_bucket, Bucket=self.bucket)
            except RemoteStorageError as exc:
                if "BucketAlreadyOwnedByYou" not in str(exc) and "BucketAlreadyExists" not in str(exc):
                    raise
        self._bucket_ready.set()

    def _put(self, key: str, body: bytes) -> None:
        self.ensure_bucket()
        self._call(f"put {key}", self.client.put_object, Bucket=self.bucket, Key=key, Body=body)

    def _get(self, key: str, range_header: str | None = None) -> bytes:
        kwargs = {"Bucket": self.bucket, "Key": key}
        if range_header:
            kwargs["Range"] = range_header
        resp = self._call(f"get {key}", self.client.get_object, **kwargs)
        try:
            return resp["Body"].read()
        except (BotoCoreError, OSError) as exc:
            raise RemoteStorageError(f"get {key}: {exc}") from exc

    def _list(self, prefix: str) -> list[dict]:
        self.ensure_bucket()
        out: list[dict] = []
        token = None
        while True:
            kwargs = {"Bucket": self.bucket, "Prefix": prefix}
            if token:
                kwargs["ContinuationToken"] = token
            resp = self._call(f"list {prefix}", self.client.list_objects_v2, **kwargs)
            out.extend(resp.get("Contents", []))
            if not resp.get("IsTruncated"):
                return out
            token = resp.get("NextContinuationToken")

    def _delete_keys(self, keys: list[str]) -> int:
        n = 0
        for i in range(0, len(keys), 1000):
            batch = keys[i:i + 1000]
            self._call("delete objects", self.client.delete_objects, Bucket=self.bucket,
                       Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True})
            n += len(batch)
        return n

    # ------------------------------------------------------------------ RemoteStorageManager

    def copy_log_segment_data(self, md: RemoteLogSegmentMetadata, data: LogSegmentData) -> int:
        total = 0
        for kind, body in data.files().items():
            self._put(self.data_key(md, kind), body)
            total += len(body)
        return total

    def fetch(self, md: RemoteLogSegmentMetadata, kind: str, start: int, end_inclusive: int | None = None) -> bytes:
        if start == 0 and end_inclusive is None:   # the whole object (a Range on an empty one is a 416)
            return self._get(self.data_key(md, kind))
        rng = f"bytes={start}-" if end_inclusive is None else f"bytes={start}-{end_inclusive}"
        return self._get(self.data_key(md, kind), rng)

    def delete_log_segment_data(self, md: RemoteLogSegmentMetadata) -> None:
        from .storage import SEGMENT_FILES
        self._delete_keys([self.data_key(md, kind) for kind in SEGMENT_FILES])

    def delete_partition_data(self, topic: str, topic_id: str) -> int:
        keys = [o["Key"] for o in self._list(self.topic_prefix(topic, topic_id))]
        return self._delete_keys(keys) if keys else 0

    def count_objects(self, topic: str, topic_id: str) -> int:
        return len(self._list(self.topic_prefix(topic, topic_id)))

    # ------------------------------------------------------------------ RemoteLogMetadataManager

    def put_segment_metadata(self, md: RemoteLogSegmentMetadata) -> None:
        from .metadata import RemoteLogSegmentState
        if md.state == RemoteLogSegmentState.DELETE_SEGMENT_FINISHED:
            keys = self._all_metadata_keys(md)
            self._delete_keys(keys)
            with self._metadata_lock:
                for k in keys:
                    self._metadata_cache.pop(k, None)
        else:
            self._put(self.metadata_key(md), md.to_json())

    def put_log_start_floor(self, topic: str, topic_id: str, partition: int, offset: int) -> None:
        """One empty object per floor, named by its offset (written once, like the metadata)."""
        self._put(f"{self.partition_prefix(topic, topic_id, partition)}{LOG_START_DIR}/{offset:020d}", b"")

    def log_start_floor(self, topic: str, topic_id: str, partition: int) -> int:
        floors = [int(o["Key"].rsplit("/", 1)[1])
                  for o in self._list(f"{self.partition_prefix(topic, topic_id, partition)}{LOG_START_DIR}/")
                  if o["Key"].rsplit("/", 1)[1].isdigit()]
        return max(floors, default=0)

    def list_segments(self, topic: str, topic_id: str, partition: int) -> list[RemoteLogSegmentMetadata]:
        """Every segment with a metadata object, in the most advanced state listed (a
        just-written object the store cannot serve yet falls back to the state before it).
        Objects are written once, so each is read once and cached for good (a legacy
        rewritten object is cached by ETag)."""
        from .metadata import FINISHED
        from .storage import SEGMENT
        meta_prefix = f"{self.partition_prefix(topic, topic_id, partition)}{METADATA_DIR}/"
        by_segment: dict[str, list[tuple[int, dict]]] = {}
        sizes: dict[str, int] = {}   # data object key -> size, from the same listing
        for obj in self._list(self.partition_prefix(topic, topic_id, partition)):
            parsed = parse_metadata_key(obj["Key"]) if obj["Key"].startswith(meta_prefix) else None
            if parsed is not None:
                by_segment.setdefault(parsed[0], []).append((parsed[1], obj))
            else:
                sizes[obj["Key"]] = int(obj.get("Size", -1))
        out = []
        for objs in by_segment.values():
            for rank, obj in sorted(objs, key=lambda ro: -ro[0]):
                md = self._read_metadata(obj, rank)
                if md is None:
                    continue
                if md.state == FINISHED and sizes.get(self.data_key(md, SEGMENT)) != md.size_bytes:
                    # a FINISHED write that timed out and landed after its segment was removed
                    # (a store that was paused applies late writes): no data, never readable
                    log.warning("ignoring remote segment %s [%d, %d] of %s-%d: finished but its data is not in "
                                "the store", md.segment_id, md.base_offset, md.end_offset, topic, partition)
                    break
                out.append(md)
                break
        return out

    def _read_metadata(self, obj: dict, rank: int) -> RemoteLogSegmentMetadata | None:
        key, etag = obj["Key"], (obj.get("ETag") if rank < 0 else "immutable")
        cached = self._metadata_cache.get(key)
        if cached is not None and etag and cached[0] == etag:
            return cached[1]   # read before (and unchanged): no GET
        try:
            md = RemoteLogSegmentMetadata.from_json(self._get(key))
        except RemoteResourceNotFoundError:
            return None  # deleted between the listing and the read (or not served yet)
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring unreadable remote segment metadata %s: %s", key, exc)
            return None
        if rank >= 0 and _STATE_SUFFIXES.get(md.state.value) != key[:-5].rsplit(".", 1)[1]:
            log.warning("ignoring remote segment metadata %s: its content says %s", key, md.state.value)
            return None
        with self._metadata_lock:
            self._metadata_cache[key] = (etag, md)
        return md


__all__ = ["S3RemoteStorage"]
