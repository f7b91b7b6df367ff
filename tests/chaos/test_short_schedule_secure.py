"""The chaos short schedule with security on (issue 16): TLS on every listener (brokers,
controllers, between brokers; the proxies forward the TLS bytes), authentication basic +
mtls (brokers are User:broker-<id> by their certificates), the ACL authorizer, as
`kraftlog cluster up --secure` configures them (deploy/cluster.py). The workload, the
checker's final reads and the harness's polls are the super user admin over verified TLS.
Same checks as test_short_schedule.py (its helper); every fault kind once.
"""
from __future__ import annotations

import pytest

from tests.chaos.harness.nemesis import ALL_NEMESES
from tests.chaos.test_short_schedule import run_short_schedule

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]


async def test_short_fault_schedule_with_security_keeps_every_acknowledged_write(tmp_path):
    figs = await run_short_schedule(tmp_path, list(ALL_NEMESES), secure=True)
    assert figs["meta"]["secure"] is True
    # security was on: a request without credentials was refused
    assert figs["anonymous_status"] == 401, figs["anonymous_status"]
    # the link faults reached the TLS connections of the processes they target (the proxies
    # told brokers and controllers apart, and cut, dropped and delayed their bytes)
    felt = figs["proxy_faults"]
    for what in ("refused", "severed", "dropped", "delayed"):
        assert any(k.startswith(f"{what} broker-") for k in felt), (what, felt)
    assert any(k.startswith(("refused controller-", "severed controller-", "dropped controller-")) for k in felt), felt
