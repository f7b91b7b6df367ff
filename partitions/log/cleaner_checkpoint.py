"""The log cleaner's side files in a log directory, and what a truncation does to them.

`cleaner-offset-checkpoint` holds the end of the last cleaning pass (the first dirty
offset of the next); `cleaner-tombstone-horizons` lists (end offset, pass time ms) of the
passes that kept tombstones (see cleaner.py). `Log` truncates them when it truncates
itself (`truncate_cleaner_state`), so this module sits below both `log.py` and
`cleaner.py` and imports neither.
"""
from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from .leader_epoch_cache import write_checkpoint_file

CLEANER_CHECKPOINT = "cleaner-offset-checkpoint"
TOMBSTONE_HORIZONS = "cleaner-tombstone-horizons"


class TombstoneHorizon(NamedTuple):
    """A cleaning pass that kept tombstones below `end_offset`, at `time_ms`: they may go
    once `time_ms` is delete.retention.ms old."""

    end_offset: int
    time_ms: int


def read_cleaner_checkpoint(log_dir: Path) -> int | None:
    try:
        lines = (Path(log_dir) / CLEANER_CHECKPOINT).read_text().split()
        if len(lines) == 2 and lines[0] == "0":
            return int(lines[1])
    except (OSError, ValueError):
        pass
    return None


def write_cleaner_checkpoint(log_dir: Path, offset: int) -> None:
    write_checkpoint_file(Path(log_dir) / CLEANER_CHECKPOINT, ["0", str(offset)])


def read_tombstone_horizons(log_dir: Path) -> list[TombstoneHorizon] | None:
    """The passes' horizons, ascending; None if the file is missing or unreadable."""
    try:
        lines = (Path(log_dir) / TOMBSTONE_HORIZONS).read_text().split("\n")
        if lines[0] != "0":
            return None
        count = int(lines[1])
        out = []
        for line in lines[2 : 2 + count]:
            end, t = line.split()
            out.append(TombstoneHorizon(int(end), int(t)))
        return out if len(out) == count else None
    except (OSError, ValueError, IndexError):
        return None


def write_tombstone_horizons(log_dir: Path, entries: list[TombstoneHorizon]) -> None:
    write_checkpoint_file(
        Path(log_dir) / TOMBSTONE_HORIZONS, ["0", str(len(entries))] + [f"{e} {t}" for e, t in entries]
    )


def truncate_cleaner_state(log_dir: Path, log_end_offset: int | None) -> None:
    """The log was truncated to `log_end_offset` (None: emptied): offsets at or above it
    will hold new records, which are dirty and whose tombstones were never passed."""
    log_dir = Path(log_dir)
    if log_end_offset is None:
        for name in (CLEANER_CHECKPOINT, TOMBSTONE_HORIZONS):
            (log_dir / name).unlink(missing_ok=True)
        return
    cp = read_cleaner_checkpoint(log_dir)
    if cp is not None and cp > log_end_offset:
        write_cleaner_checkpoint(log_dir, log_end_offset)
    horizons = read_tombstone_horizons(log_dir)
    if horizons and horizons[-1].end_offset > log_end_offset:
        kept = [h for h in horizons if h.end_offset <= log_end_offset]
        nxt = next((h for h in horizons if h.end_offset > log_end_offset), None)
        if nxt is not None and (not kept or kept[-1].end_offset < log_end_offset):
            kept.append(TombstoneHorizon(log_end_offset, nxt.time_ms))
        write_tombstone_horizons(log_dir, kept)


__all__ = [
    "CLEANER_CHECKPOINT",
    "TOMBSTONE_HORIZONS",
    "TombstoneHorizon",
    "read_cleaner_checkpoint",
    "write_cleaner_checkpoint",
    "read_tombstone_horizons",
    "write_tombstone_horizons",
    "truncate_cleaner_state",
]
