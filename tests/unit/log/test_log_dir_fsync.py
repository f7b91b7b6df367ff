"""A new log's directory is fsynced by its first flush, not by Log.open (issue 25: one
fsync per partition created, 42 ms each on a busy disk, bounded topic creation)."""
from __future__ import annotations

from logtest_helpers import make_batch

import partitions.log.log as log_mod
from partitions.log.config import LogConfig
from partitions.log.log import Log


def test_open_does_not_fsync_the_new_dir_the_first_flush_does(tmp_path, monkeypatch, clock):
    synced = []
    monkeypatch.setattr(log_mod, "fsync_dir", lambda d: synced.append(str(d)))
    path = tmp_path / "t-0"
    lg = Log.open(path, LogConfig(), clock=clock)
    assert synced == []                               # creating the partition costs no fsync
    lg.append_as_leader(make_batch(2), 0)
    lg.flush()
    assert synced == [str(path)]                      # durable before the recovery point moves
    assert lg.recovery_point == 2
    lg.append_as_leader(make_batch(1), 0)
    lg.flush()
    assert synced == [str(path)]                      # once
    lg.close()

