"""In-process broker harness for functional tests: real app + replica manager + storage,
fake controller (pure QuorumController + MetadataImage in memory).

A module of its own (not conftest.py) so tests can import it by a unique name: several
directories have a conftest.py and `from conftest import ...` picks whichever loaded first.
"""

from __future__ import annotations

import contextlib
import os
import sys

from aiohttp.test_utils import TestClient, TestServer

sys.path.insert(0, os.path.dirname(__file__))

from fake_controller import FakeControllerClient  # noqa: E402

from http_api.broker.app import BrokerDeps, create_app  # noqa: E402
from http_api.broker.config import BrokerConfig  # noqa: E402
from http_api.broker.group_offsets import GroupOffsetStore  # noqa: E402
from http_api.broker.metadata_view import MetadataView  # noqa: E402
from partitions.replication.replica_manager import ReplicaManager  # noqa: E402
from partitions.replication.replica_fetcher import ReplicaFetcherManager  # noqa: E402
from http_api.broker.internal_auth import internal_token  # noqa: E402
from http_api.broker.replica_client import ReplicaTransport  # noqa: E402
from partitions.clock import SYSTEM_CLOCK, Clock  # noqa: E402


def make_log_manager(log_dir: str):
    """The real storage engine in one log dir (no default-config factory needed)."""
    from partitions.log.config import LogConfig
    from partitions.log.log_manager import LogManager

    lm = LogManager([log_dir], LogConfig())
    lm.open_all()
    return lm, None


class BrokerHarness:
    """One broker app in-process, with handles on its parts."""

    def __init__(self, client: TestClient, config: BrokerConfig, rm, view, controller, log_manager, fetcher=None):
        self.fetcher = fetcher
        self.client = client
        self.config = config
        self.rm = rm
        self.view = view
        self.controller = controller
        self.log_manager = log_manager


async def start_broker(tmp_path, controller: FakeControllerClient, broker_id: int = 1, *,
                       clock: Clock = SYSTEM_CLOCK, **overrides):
    """One broker in-process; whatever it had opened is closed again if it fails to start.
    `clock` is the group coordinator's (BrokerDeps.clock)."""
    cfg = BrokerConfig(broker_id=broker_id, log_dirs=[str(tmp_path / f"b{broker_id}" / "logs")],
                       state_dir=str(tmp_path / f"b{broker_id}"), **overrides)
    lm, factory = make_log_manager(cfg.log_dirs[0])
    h = BrokerHarness(None, cfg, None, None, controller, lm)
    try:
        rm = ReplicaManager(broker_id, lm, min_insync_replicas=cfg.min_insync_replicas,
                            request_timeout_ms=cfg.request_timeout_ms,
                            max_concurrent_long_polls=cfg.long_poll_max_requests,
                            default_log_config_factory=factory)
        h.rm = rm
        view = MetadataView(rm)
        h.view = view
        h.fetcher = ReplicaFetcherManager(rm, ReplicaTransport(internal_token=internal_token(cfg.cluster_secret)),
                                          broker_id, fetch_wait_max_ms=200,
                                          backoff_ms=20)
        view.add_listener(h.fetcher.sync)
        controller.views.append(view)
        deps = BrokerDeps(replica_manager=rm, metadata=view, controller=controller,
                          groups=GroupOffsetStore(os.path.join(cfg.state_dir, "group-offsets.json")),
                          clock=clock)
        app = create_app(cfg, deps)
        server = TestServer(app)
        h.client = TestClient(server)
        await h.client.start_server()
        cfg.advertised_url = str(server.make_url("")).rstrip("/")
        await controller.add_broker(broker_id, cfg.url)
    except BaseException:
        await stop_broker(h)
        raise
    return h


async def stop_broker(h) -> None:
    """Closes the fetchers, the HTTP server and client, and the logs; every step runs even
    when an earlier one fails (the first error is raised at the end)."""
    steps = []
    if h.fetcher is not None:
        steps += [h.fetcher.close, h.fetcher.transport.close]
    if h.client is not None:
        steps.append(h.client.close)
    if h.view is not None and h.view in h.controller.views:
        h.controller.views.remove(h.view)   # a stopped broker hears no more metadata
    error: BaseException | None = None
    for step in steps:
        try:
            await step()
        except BaseException as e:  # noqa: BLE001 - close the rest first
            error = error or e
    try:
        h.log_manager.close()
    except BaseException as e:  # noqa: BLE001
        error = error or e
    if error is not None:
        raise error


@contextlib.asynccontextmanager
async def running_broker(tmp_path, controller: FakeControllerClient, broker_id: int = 1, **overrides):
    """`async with running_broker(...) as h:` -- stopped on the way out, also on failure."""
    h = await start_broker(tmp_path, controller, broker_id, **overrides)
    try:
        yield h
    finally:
        await stop_broker(h)
