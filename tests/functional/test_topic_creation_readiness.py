"""Topic creation answers when the topic is ready on its brokers (issue 25): 201 once every
broker hosting a replica has published the creating metadata offset, else 202 "creating"
(never a bare timeout); /healthz answers 503 while the broker's metadata lags too long."""
import copy

from tests.functional.broker_harness import running_broker
from tests.functional.fake_controller import FakeControllerClient


class LaggingController(FakeControllerClient):
    """Publishes to every broker's view but those in `lagging`; create answers carry the
    metadata offset, as the real controller's do."""

    def __init__(self) -> None:
        super().__init__()
        self.lagging: set = set()

    async def publish(self) -> None:
        for view in self.views:
            if id(view) not in self.lagging:
                await view.update(copy.deepcopy(self.image))

    async def create_topic(self, name, partitions, replication_factor, configs=None):
        doc = await super().create_topic(name, partitions, replication_factor, configs)
        return dict(doc, metadata_offset=self.image.offset)


async def test_create_answers_202_while_a_replica_broker_has_not_published_the_topic(tmp_path):
    controller = LaggingController()
    async with running_broker(tmp_path, controller, 1, metadata_wait_ms=1500) as b1, \
            running_broker(tmp_path, controller, 2) as b2:
        controller.lagging.add(id(b2.view))
        r = await b1.client.post("/v1/topics", json={"name": "slow", "partitions": 4, "replication_factor": 2})
        body = await r.json()
        assert r.status == 202, body
        assert body["creating"] is True and body["brokers_pending"] == [2] and body["name"] == "slow"
        assert len(body["partitions"]) == 4 and "metadata_offset" not in body
        assert r.headers["Location"] == "/v1/topics/slow" and r.headers["Retry-After"] == "1"
        # the broker that has it serves it whole; the lagging one does not know it yet
        assert (await b1.client.get("/v1/topics/slow")).status == 200
        assert (await b2.client.get("/v1/topics/slow")).status == 404
        # once every replica broker published it, a create answers 201
        controller.lagging.clear()
        await controller.publish()
        r = await b1.client.post("/v1/topics", json={"name": "fast", "partitions": 4, "replication_factor": 2})
        assert r.status == 201, await r.text()
        health = await (await b2.client.get("/healthz")).json()
        assert health["published_metadata_offset"] == controller.image.offset


async def test_healthz_answers_503_once_metadata_lags_longer_than_the_limit(tmp_path):
    controller = FakeControllerClient()
    async with running_broker(tmp_path, controller, 1, metadata_lag_max_ms=5000) as b1:
        r = await b1.client.get("/healthz")
        assert r.status == 200 and (await r.json())["metadata_lag_ms"] == 0
        b1.view.lag = lambda: (12, 4000)         # behind, within the limit
        r = await b1.client.get("/healthz")
        assert r.status == 200 and (await r.json())["metadata_lag_records"] == 12
        b1.view.lag = lambda: (12, 6000)         # behind for longer than metadata_lag_max_ms
        r = await b1.client.get("/healthz")
        body = await r.json()
        assert r.status == 503 and body["status"] == "metadata_lagging" and body["metadata_lag_ms"] == 6000
        metrics = await (await b1.client.get("/metrics")).text()
        assert "kraftlog_metadata_lag_records 12.0" in metrics and "kraftlog_metadata_lag_ms 6000.0" in metrics
