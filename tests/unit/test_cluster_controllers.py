"""`kraftlog cluster up` after add-controller / remove-controller (deploy/cluster.py): every
controller the cluster has had is in `--voters` (the raft log replays the membership
changes), and the controllers the quorum removed are not started again."""
from deploy.cluster import RAFT_PORT_OFFSET, _node_config, controller_ids, started_controller_ids

STATE = {"nodes": 2, "base_port": 20000, "data_dir": "/d", "cluster_id": "c", "password": "p",
         "added_brokers": [3], "added_controllers": [4], "removed_controllers": [1]}


def test_up_starts_every_controller_not_removed_with_all_of_them_as_voters():
    assert controller_ids(STATE) == [1, 2, 4]
    assert started_controller_ids(STATE) == [2, 4]
    voters = _node_config(STATE, 4).voters.split(",")
    assert [v.split("@")[0] for v in voters] == ["1", "2", "4"]
    assert voters[2] == f"4@127.0.0.1:{20000 + RAFT_PORT_OFFSET + 3}:{20000 + 1000 + 3}"
    assert started_controller_ids({"nodes": 3}) == [1, 2, 3]
