"""`cluster.json` holds the raft password: only its owner may read it."""
from __future__ import annotations

import os
import stat

from deploy.cluster import STATE_FILE, load_state, save_state


def test_cluster_state_is_owner_only(tmp_path):
    save_state(str(tmp_path), {"password": "secret", "nodes": []})
    mode = stat.S_IMODE(os.stat(tmp_path / STATE_FILE).st_mode)
    assert mode & 0o077 == 0, oct(mode)
    assert load_state(str(tmp_path))["password"] == "secret"
