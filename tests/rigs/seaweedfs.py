"""A real SeaweedFS S3 store for the tiered storage tests (never a mock of S3).

`seaweedfs_store(tmp_dir)` starts `weed server` on free ports under the test's directory
(deploy/seaweedfs.py) and stops it by pid; `store.stop()` / `store.restart()` take it down
and bring it back on the same ports and data (the "store down under load" test).
"""
from __future__ import annotations

import contextlib
import os

from deploy.seaweedfs import ACCESS_KEY_ID, SECRET_ACCESS_KEY, SeaweedFS, SeaweedPorts


class SeaweedStore:
    def __init__(self, directory: str) -> None:
        self.server = SeaweedFS(directory, SeaweedPorts.free())

    @property
    def endpoint(self) -> str:
        return self.server.endpoint

    def start(self) -> "SeaweedStore":
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()

    def pause(self) -> None:
        """The store stops answering (SIGSTOP): every request hangs until its timeout."""
        self.server.pause()

    def resume(self) -> None:
        self.server.resume()

    def restart(self) -> None:
        self.server.stop()
        self.server.start()

    def client(self):
        import boto3
        from botocore.config import Config
        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY_ID,
                            aws_secret_access_key=SECRET_ACCESS_KEY, region_name="us-east-1",
                            config=Config(connect_timeout=5, read_timeout=10, retries={"max_attempts": 2},
                                          s3={"addressing_style": "path"}))

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        c = self.client()
        out, token = [], None
        while True:
            kw = {"Bucket": bucket, "Prefix": prefix}
            if token:
                kw["ContinuationToken"] = token
            try:
                resp = c.list_objects_v2(**kw)
            except c.exceptions.NoSuchBucket:
                return []
            out += [o["Key"] for o in resp.get("Contents", [])]
            if not resp.get("IsTruncated"):
                return out
            token = resp["NextContinuationToken"]

    def broker_settings(self, bucket: str = "kraftlog-test") -> dict:
        """[remote_storage] settings (flat) pointing a broker at this store."""
        return {"remote_storage_enable": True, "remote_storage_s3_endpoint": self.endpoint,
                "remote_storage_s3_bucket": bucket, "remote_storage_s3_region": "us-east-1",
                "remote_storage_s3_access_key_id": ACCESS_KEY_ID,
                "remote_storage_s3_secret_access_key": SECRET_ACCESS_KEY,
                "remote_storage_request_timeout_ms": 2000, "remote_log_manager_task_interval_ms": 200,
                "remote_log_copy_backoff_max_ms": 2000}


@contextlib.contextmanager
def seaweedfs_store(directory: str):
    store = SeaweedStore(os.path.join(directory, "seaweedfs"))
    try:
        store.start()
        yield store
    finally:
        store.resume()   # a paused store must be able to die
        store.stop()
