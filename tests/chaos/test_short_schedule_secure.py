"""The chaos short schedule with security on (issue 16): TLS on every listener (brokers,
controllers, between brokers; the proxies forward the TLS bytes), authentication basic +
mtls (brokers are User:broker-<id> by their certificates), the ACL authorizer, as
`kraftlog cluster up --secure` configures them (deploy/cluster.py). The workload, the
checker's final reads and the harness's polls are the super user admin over verified TLS.
Same checks as test_short_schedule.py (its helper), with the fault kinds whose paths TLS
changes: process kills (TLS sessions and listeners started again, clients reconnecting) and
every link fault (the proxies cut, drop, delay and one-way the TLS bytes). The kinds that act
on a process's CPU, disk or clock only (pauses, disk-full, torn and lost tails, clock jumps,
several kills at once) run in test_short_schedule.py; TLS on or off does not change them.
"""
from __future__ import annotations

import pytest

from tests.chaos.harness.nemesis import ALL_NEMESES
from tests.chaos.test_short_schedule import run_short_schedule

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]


# the kinds that meet TLS: kills and every link fault (see the module docstring)
SECURE_KINDS = ["kill-broker", "kill-active-controller", "isolate-broker", "blackhole-broker", "one-way-answers",
                "one-way-control", "slow-links", "broker-partition", "controller-partition", "controller-one-way",
                "isolate-host"]


async def test_short_fault_schedule_with_security_keeps_every_acknowledged_write(tmp_path):
    assert set(SECURE_KINDS) <= set(ALL_NEMESES)
    figs = await run_short_schedule(tmp_path, SECURE_KINDS, secure=True)
    assert figs["meta"]["secure"] is True
    # security was on: a request without credentials was refused
    assert figs["anonymous_status"] == 401, figs["anonymous_status"]
    # the link faults reached the TLS connections of the processes they target (the proxies
    # told brokers and controllers apart, and cut, dropped and delayed their bytes)
    felt = figs["proxy_faults"]
    for what in ("refused", "severed", "dropped", "delayed"):
        assert any(k.startswith(f"{what} broker-") for k in felt), (what, felt)
    assert any(k.startswith(("refused controller-", "severed controller-", "dropped controller-")) for k in felt), felt
