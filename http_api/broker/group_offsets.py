"""Per-broker file-backed store of committed consumer group offsets.

Job: remember `(group, topic, partition) -> offset` (offset = next record to read) across
restarts. Commits are applied in memory at once and persisted by write-temp, fsync,
rename in an executor, so the event loop never blocks on disk. A later issue moves this
into the `__consumer_offsets` topic; the interface (commit / fetch) stays.
"""
from __future__ import annotations

import asyncio
import json
import os
import re

from partitions.errors import ErrorCode, KraftlogError

GROUP_NAME_MAX_CHARS = 249
_GROUP_RE = re.compile(r"^[A-Za-z0-9._\-]+$")


def validate_group_id(group: str) -> None:
    if not group or len(group) > GROUP_NAME_MAX_CHARS or not _GROUP_RE.match(group):
        raise KraftlogError(ErrorCode.INVALID_REQUEST,
                            f"group id {group!r} is invalid: use 1-{GROUP_NAME_MAX_CHARS} characters "
                            "from [A-Za-z0-9._-]")


class GroupOffsetStore:
    """Committed offsets of every group this broker was asked about, persisted to one file."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._groups: dict[str, dict[tuple[str, int], int]] = {}
        self._lock = asyncio.Lock()
        self._dirty = False
        if os.path.exists(path):
            with open(path, "rb") as f:
                raw = json.load(f)
            for g, entries in raw.items():
                self._groups[g] = {(e["topic"], int(e["partition"])): int(e["offset"]) for e in entries}

    def fetch(self, group: str) -> list[dict]:
        entries = self._groups.get(group, {})
        return [{"topic": t, "partition": p, "offset": o} for (t, p), o in sorted(entries.items())]

    async def commit(self, group: str, offsets: list[tuple[str, int, int]]) -> None:
        g = self._groups.setdefault(group, {})
        for topic, partition, offset in offsets:
            g[(topic, partition)] = offset
        await self._persist()

    async def forget(self, group: str) -> None:
        """Drop a group (once its offsets were imported into `__consumer_offsets`)."""
        if self._groups.pop(group, None) is not None:
            await self._persist()

    async def _persist(self) -> None:
        self._dirty = True
        async with self._lock:  # one writer at a time; later commits fold into one write
            if not self._dirty:
                return
            self._dirty = False
            snapshot = {name: [{"topic": t, "partition": p, "offset": o} for (t, p), o in sorted(e.items())]
                        for name, e in self._groups.items()}
            await asyncio.get_running_loop().run_in_executor(None, _write_atomic, self.path, snapshot)

    def delete_topic(self, topic: str) -> None:
        for entries in self._groups.values():
            for key in [k for k in entries if k[0] == topic]:
                del entries[key]


def _write_atomic(path: str, doc) -> None:
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(json.dumps(doc).encode())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
