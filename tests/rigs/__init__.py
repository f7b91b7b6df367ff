"""Test rigs: real controller and broker processes on free ports (integration tests, bench).

`tests.rigs.controllers.ControllerCluster` runs controller processes; `tests.rigs.cluster.
ReplicatedCluster` runs controllers plus brokers. They live under tests/ because no
production package needs them.
"""
