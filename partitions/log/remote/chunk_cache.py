"""`ChunkCache`: a bounded on-disk cache of remote byte ranges (file IO only).

Remote reads fetch whole chunks (`chunk_bytes`, aligned) of a remote segment file; each
chunk is kept as one file `<dir>/<segment_id>.<kind>.<chunk_no>` (written temp + rename,
so a crash never leaves a torn chunk under its name). The total size stays at most
`max_bytes`: the least recently used chunks are removed first. The cache starts empty
(leftovers of a previous process are removed): it is only ever a cache.
"""
from __future__ import annotations

import os
import shutil
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Callable


class ChunkCache:
    def __init__(self, directory: str | Path, *, chunk_bytes: int, max_bytes: int) -> None:
        self.dir = Path(directory)
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.chunk_bytes = chunk_bytes
        self.max_bytes = max_bytes
        self._lru: OrderedDict[str, int] = OrderedDict()  # file name -> size
        self._size = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @property
    def size_bytes(self) -> int:
        return self._size

    def _name(self, segment_id: str, kind: str, chunk: int) -> str:
        return f"{segment_id}.{kind}.{chunk}"

    def get_chunk(self, segment_id: str, kind: str, chunk: int, load: Callable[[int, int], bytes]) -> bytes:
        """Chunk `chunk` of the file; `load(start, end_inclusive)` fetches it on a miss."""
        name = self._name(segment_id, kind, chunk)
        with self._lock:
            if name in self._lru:
                self._lru.move_to_end(name)
                try:
                    data = (self.dir / name).read_bytes()
                    self.hits += 1
                    return data
                except FileNotFoundError:
                    self._size -= self._lru.pop(name)
            self.misses += 1
        start = chunk * self.chunk_bytes
        data = load(start, start + self.chunk_bytes - 1)
        self._put(name, data)
        return data

    def _put(self, name: str, data: bytes) -> None:
        if len(data) > self.max_bytes:
            return
        tmp = self.dir / f".{name}.{threading.get_ident()}.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, self.dir / name)
        with self._lock:
            if name in self._lru:
                self._size -= self._lru.pop(name)
            self._lru[name] = len(data)
            self._size += len(data)
            while self._size > self.max_bytes and self._lru:
                old, size = self._lru.popitem(last=False)
                self._size -= size
                try:
                    (self.dir / old).unlink()
                except FileNotFoundError:
                    pass

    def read(self, segment_id: str, kind: str, start: int, length: int, file_size: int,
             load: Callable[[int, int], bytes]) -> bytes:
        """Bytes [start, start + length) of a remote file of `file_size` bytes, via chunks."""
        end = min(start + length, file_size)
        if start >= end:
            return b""
        parts = []
        for chunk in range(start // self.chunk_bytes, (end - 1) // self.chunk_bytes + 1):
            data = self.get_chunk(segment_id, kind, chunk, load)
            c0 = chunk * self.chunk_bytes
            parts.append(data[max(start - c0, 0): end - c0])
        return b"".join(parts)

    def evict_segment(self, segment_id: str) -> None:
        """Forget the chunks of a deleted remote segment."""
        with self._lock:
            for name in [n for n in self._lru if n.startswith(segment_id + ".")]:
                self._size -= self._lru.pop(name)
                try:
                    (self.dir / name).unlink()
                except FileNotFoundError:
                    pass


__all__ = ["ChunkCache"]
