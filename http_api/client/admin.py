"""`AdminClient`: create / list / describe / delete topics, metadata and consumer groups,
against any broker (which forwards to the controller)."""
from __future__ import annotations

import aiohttp

from http_api.client.transport import DEFAULT_CONNECT_TIMEOUT_MS, DEFAULT_REQUEST_ATTEMPT_TIMEOUT_MS, Transport


class AdminClient:
    """Topic administration against any broker (which forwards to the controller)."""

    def __init__(self, bootstrap=None, *, client_id: str | None = None, request_timeout_ms: int = 30_000,
                 session: aiohttp.ClientSession | None = None,
                 request_attempt_timeout_ms: int = DEFAULT_REQUEST_ATTEMPT_TIMEOUT_MS,
                 connect_timeout_ms: int = DEFAULT_CONNECT_TIMEOUT_MS,
                 user: str | None = None, password: str | None = None, token: str | None = None,
                 ca_file: str | None = None) -> None:
        self.t = Transport(bootstrap, client_id=client_id, request_timeout_ms=request_timeout_ms, session=session,
                           request_attempt_timeout_ms=request_attempt_timeout_ms,
                           connect_timeout_ms=connect_timeout_ms,
                           user=user, password=password, token=token, ca_file=ca_file)   # credentials: API.md Security

    async def create_topic(self, name: str, partitions: int = 1, replication_factor: int | None = 1,
                           configs: dict | None = None) -> dict:
        """Create a topic; `replication_factor=None` takes the brokers' default_replication_factor."""
        body = {"name": name, "partitions": partitions, "configs": configs or {}}
        if replication_factor is not None:
            body["replication_factor"] = replication_factor
        _, doc = await self.t.bootstrap_json("POST", "/v1/topics", json_body=body)
        return doc

    async def list_topics(self) -> list[str]:
        _, doc = await self.t.bootstrap_json("GET", "/v1/topics")
        return doc["topics"]

    async def describe_topic(self, name: str) -> dict:
        _, doc = await self.t.bootstrap_json("GET", f"/v1/topics/{name}")
        return doc

    async def create_partitions(self, name: str, partitions: int) -> dict:
        """Grow `name` to `partitions` partitions in total (Kafka's CreatePartitions); the topic as in metadata."""
        _, doc = await self.t.bootstrap_json("POST", f"/v1/topics/{name}/partitions", json_body={"partitions": partitions})
        return doc

    async def delete_topic(self, name: str) -> None:
        await self.t.bootstrap_json("DELETE", f"/v1/topics/{name}")

    async def metadata(self) -> dict:
        _, doc = await self.t.bootstrap_json("GET", "/v1/metadata")
        return doc

    # consumer groups (http_api/broker/groups.py)
    async def list_groups(self) -> list[dict]:
        _, doc = await self.t.bootstrap_json("GET", "/v1/groups")
        return doc["groups"]

    async def describe_group(self, group: str) -> dict:
        _, doc = await self.t.bootstrap_json("GET", f"/v1/groups/{group}")
        return doc

    async def delete_group(self, group: str) -> None:
        await self.t.bootstrap_json("DELETE", f"/v1/groups/{group}")

    async def close(self) -> None:
        await self.t.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()
