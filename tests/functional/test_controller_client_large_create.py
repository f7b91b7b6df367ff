"""A topic create that the controller takes longer than one short try to answer (thousands of
partitions on a loaded machine) is answered, once: the broker's ControllerClient waits its
whole request deadline for it instead of retrying after each short try (each retry made the
controller decide and propose every partition again; they piled up until the deadline, 504)."""
from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.test_utils import TestServer

from metadata_quorum.client import PREFIX, ControllerClient

ANSWER_AFTER_S = 0.6   # the controller's commit time; a try is 0.15 s


async def _slow_controller(tries: list) -> TestServer:
    async def create(request: web.Request) -> web.Response:
        body = await request.json()
        tries.append(body["request_id"])
        await asyncio.sleep(ANSWER_AFTER_S)
        return web.json_response({"name": body["name"], "partitions": [], "metadata_offset": 7}, status=201)

    async def create_partitions(request: web.Request) -> web.Response:
        tries.append((await request.json())["request_id"])
        await asyncio.sleep(ANSWER_AFTER_S)
        return web.json_response({"name": request.match_info["topic"], "partitions": []})

    app = web.Application()
    app.router.add_post(PREFIX + "/topics", create)
    app.router.add_post(PREFIX + "/topics/{topic}/partitions", create_partitions)
    server = TestServer(app)
    await server.start_server()
    return server


async def test_a_slow_create_is_waited_for_in_one_try_not_retried_until_the_deadline():
    tries: list = []
    server = await _slow_controller(tries)
    client = ControllerClient([str(server.make_url("")).rstrip("/")], request_timeout_ms=5_000, try_timeout_ms=150,
                              retry_backoff_ms=10)
    try:
        doc = await client.create_topic("big", 5100, 1)
        assert doc["metadata_offset"] == 7 and len(tries) == 1, tries
        await client.create_partitions("big", 5200)
        assert len(tries) == 2, tries
    finally:
        await client.close()
        await server.close()
