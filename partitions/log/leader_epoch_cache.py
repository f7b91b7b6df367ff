"""Leader epoch cache: which leader epoch started at which offset (Kafka's
LeaderEpochFileCache), persisted as `leader-epoch-checkpoint` in the log directory.

Entries (epoch, start_offset) are strictly increasing in both fields. Followers use
`end_offset_for_epoch` (OffsetsForLeaderEpoch) to find where their log diverges from the
leader's and truncate there.

File format (Kafka's checkpoint text format): a version line `0`, a count line, then one
`<epoch> <start_offset>` line per entry. Written temp + fsync + rename + fsync dir.
"""
from __future__ import annotations

import logging
import os
from bisect import bisect_left, bisect_right
from pathlib import Path

log = logging.getLogger(__name__)

LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1


def write_checkpoint_file(path: Path, lines: list[str], *, sync: bool = True, tmp_suffix: str = ".tmp") -> None:
    """Atomically replace `path` with `lines` (temp file, fsync, rename, fsync dir; without
    `sync`: temp file and rename only, durable once a later synced write or flush lands)."""
    tmp = path.with_name(path.name + tmp_suffix)
    with open(tmp, "w") as f:
        f.write("\n".join(lines) + "\n")
        f.flush()
        if sync:
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if sync:
        fsync_dir(path.parent)


def fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class LeaderEpochCache:
    """(epoch, start_offset) entries, both strictly increasing; persisted on change."""

    def __init__(self, path: str | Path | None, entries: list[tuple[int, int]] | None = None):
        self.path = Path(path) if path is not None else None
        self.unsynced = False   # the file was written without fsync since the last synced write
        self._epochs: list[int] = []
        self._offsets: list[int] = []
        for epoch, offset in entries or []:
            self._assign(epoch, offset)

    @classmethod
    def load(cls, path: str | Path) -> "LeaderEpochCache":
        """Read the checkpoint; a missing or malformed file gives an empty cache (the log
        rebuilds it from batch headers)."""
        cache = cls(path)
        cache.loaded_ok = False
        try:
            text = Path(path).read_text()
        except FileNotFoundError:
            return cache
        except OSError as exc:
            log.warning("cannot read %s: %s; rebuilding the leader epoch cache", path, exc)
            return cache
        try:
            lines = [line for line in text.splitlines() if line.strip()]
            if not lines or int(lines[0]) != 0:
                raise ValueError("bad version")
            count = int(lines[1])
            entries = [tuple(int(x) for x in line.split()) for line in lines[2 : 2 + count]]
            if len(entries) != count or any(len(e) != 2 for e in entries):
                raise ValueError("bad entry count")
            for (e1, o1), (e2, o2) in zip(entries, entries[1:]):
                if e2 <= e1 or o2 < o1:
                    raise ValueError("entries not increasing")
        except (ValueError, IndexError) as exc:
            log.warning("malformed %s (%s); rebuilding the leader epoch cache", path, exc)
            return cache
        cache._epochs = [e for e, _ in entries]
        cache._offsets = [o for _, o in entries]
        cache.loaded_ok = True
        return cache

    loaded_ok = True

    # ------------------------------------------------------------------ queries

    @property
    def entries(self) -> list[tuple[int, int]]:
        return list(zip(self._epochs, self._offsets))

    @property
    def latest_epoch(self) -> int:
        return self._epochs[-1] if self._epochs else UNDEFINED_EPOCH

    @property
    def earliest_entry(self) -> tuple[int, int] | None:
        return (self._epochs[0], self._offsets[0]) if self._epochs else None

    def start_offset_of(self, epoch: int) -> int | None:
        i = bisect_left(self._epochs, epoch)
        if i < len(self._epochs) and self._epochs[i] == epoch:
            return self._offsets[i]
        return None

    def epoch_for_offset(self, offset: int) -> int:
        """The epoch that wrote `offset` (largest entry with start <= offset), or -1."""
        i = bisect_right(self._offsets, offset) - 1
        return self._epochs[i] if i >= 0 else UNDEFINED_EPOCH

    def end_offset_for_epoch(self, requested_epoch: int, log_end_offset: int) -> tuple[int, int]:
        """Kafka OffsetsForLeaderEpoch: (largest epoch <= requested, start offset of the
        next higher epoch, or log_end_offset when it is the latest); (-1, -1) if unknown."""
        if requested_epoch == UNDEFINED_EPOCH or not self._epochs:
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if requested_epoch == self._epochs[-1]:
            return requested_epoch, log_end_offset
        higher = bisect_right(self._epochs, requested_epoch)  # first epoch > requested
        if higher >= len(self._epochs):
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        floor = higher - 1
        if floor < 0:
            return requested_epoch, self._offsets[higher]
        return self._epochs[floor], self._offsets[higher]

    # ------------------------------------------------------------------ updates

    def _assign(self, epoch: int, start_offset: int) -> bool:
        if epoch < 0 or start_offset < 0:
            return False
        if self._epochs and epoch == self._epochs[-1] and start_offset >= self._offsets[-1]:
            return False
        # drop entries that conflict with the new one (Kafka: epoch >= new or start >= new)
        while self._epochs and (self._epochs[-1] >= epoch or self._offsets[-1] >= start_offset):
            self._epochs.pop()
            self._offsets.pop()
        self._epochs.append(epoch)
        self._offsets.append(start_offset)
        return True

    def assign(self, epoch: int, start_offset: int, *, persist: bool = True) -> bool:
        """Record that `epoch` starts at `start_offset`. No-op for a known epoch at a later
        offset; removes conflicting later entries. Returns True if the cache changed."""
        changed = self._assign(epoch, start_offset)
        if changed and persist:
            self.persist()
        return changed

    def truncate_from_end(self, end_offset: int, *, persist: bool = True) -> bool:
        """Drop entries starting at or after `end_offset` (the log was truncated there).
        Returns True if the cache changed (nothing is written when it did not)."""
        i = bisect_left(self._offsets, end_offset)
        if i >= len(self._offsets):
            return False
        del self._epochs[i:]
        del self._offsets[i:]
        if persist:
            self.persist()
        return True

    def truncate_from_start(self, start_offset: int, *, persist: bool = True) -> None:
        """Drop entries wholly before `start_offset`; the entry covering it now starts there."""
        i = bisect_right(self._offsets, start_offset) - 1
        if i < 0 or (i == 0 and self._offsets[0] == start_offset):
            return
        epoch = self._epochs[i]
        del self._epochs[: i + 1]
        del self._offsets[: i + 1]
        self._epochs.insert(0, epoch)
        self._offsets.insert(0, start_offset)
        if persist:
            self.persist()

    def clear(self, *, persist: bool = True) -> None:
        self._epochs.clear()
        self._offsets.clear()
        if persist:
            self.persist()

    def lines(self) -> list[str]:
        """The checkpoint file's lines for the current entries."""
        return ["0", str(len(self._epochs))] + [f"{e} {o}" for e, o in zip(self._epochs, self._offsets)]

    def persist(self, *, sync: bool = True) -> None:
        """Write the checkpoint; `sync=False` (the append path: a new epoch's first batch;
        a follower's truncation, as Kafka since KAFKA-15046) skips the fsyncs and leaves `unsynced` set until `Log.flush` writes it synced
        (`write_synced`): a crash before that loses nothing, recovery re-reads the epochs of
        the batches above the recovery point (issue 25: two fsyncs per partition on the
        event loop at its first produce stalled brokers creating thousands of partitions)."""
        if self.path is None or not self.path.parent.exists():
            return
        write_checkpoint_file(self.path, self.lines(), sync=sync)
        self.unsynced = not sync

    def write_synced(self, lines: list[str]) -> None:
        """Write `lines` (taken under the log's lock) durably, from a flushing thread."""
        if self.path is None or not self.path.parent.exists():
            return
        write_checkpoint_file(self.path, lines, tmp_suffix=".sync.tmp")

    def __repr__(self) -> str:
        return f"LeaderEpochCache({self.entries})"
