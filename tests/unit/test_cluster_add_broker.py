"""`kraftlog cluster add-broker` picks its node id from cluster.json (deploy/cluster.py)."""

from deploy.cluster import next_node_id


def test_cluster_add_broker_takes_a_node_id_nobody_has():
    assert next_node_id({"nodes": 3}) == 4
    assert next_node_id({"nodes": 3, "added_brokers": [4]}) == 5
    assert next_node_id({"nodes": 3, "added_brokers": [4], "added_controllers": [5],
                         "processes": [{"node_id": 1, "role": "broker"}]}) == 6
