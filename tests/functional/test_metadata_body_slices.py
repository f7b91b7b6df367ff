"""`GET /v1/metadata` at scale (issue 25): the body is built a topic at a time with turns of
the event loop between slices of partitions (14 MB and 1.05 s of CPU in one turn at 100,000
partitions), byte for byte the body it was before, and built once per published image."""
import asyncio

from http_api.broker.topics import metadata_body_in_slices
from http_api.wire.codecs import JSON, encode_document
from tests.functional.broker_harness import running_broker
from tests.functional.fake_controller import FakeControllerClient
from tests.rigs.metadata_image import ImageBuilder


def _image(topics: int, partitions: int):
    b = ImageBuilder(seed=7)
    for i in range(topics):
        b.create(f"t{i}", partitions, 3, {"cleanup.policy": "compact"} if i == 1 else None)
    b.image.cluster_id = "c-ü"   # non-ASCII kept as UTF-8, as json_response does
    return b.image


async def test_the_body_is_the_same_bytes_built_over_several_turns():
    img = _image(4, 700)
    turns = 0
    stop = False

    def tick():
        nonlocal turns
        if not stop:
            turns += 1
            asyncio.get_running_loop().call_soon(tick)
    asyncio.get_running_loop().call_soon(tick)
    body = await metadata_body_in_slices(img, slice_partitions=1000)
    stop = True
    assert body == encode_document(JSON, img.to_metadata_json())
    assert turns >= 2   # 2,800 partitions, a yield after every 1,000+: the loop ran in between


async def test_get_metadata_serves_one_body_per_published_image(tmp_path):
    controller = FakeControllerClient()
    async with running_broker(tmp_path, controller, 1) as b:
        assert (await b.client.post("/v1/topics", json={"name": "a", "partitions": 3})).status == 201
        r1 = await b.client.get("/v1/metadata")
        body1 = await r1.read()
        assert r1.status == 200 and r1.content_type == "application/json"
        assert body1 == encode_document(JSON, b.view.image.to_metadata_json())
        assert await (await b.client.get("/v1/metadata")).read() == body1
        assert (await b.client.post("/v1/topics", json={"name": "b", "partitions": 2})).status == 201
        doc = await (await b.client.get("/v1/metadata")).json()
        assert [t["name"] for t in doc["topics"]] == ["a", "b"]   # a new image: a new body
