"""Python client for kraftlog brokers: `Producer`, `Consumer`, `AdminClient` (asyncio) and
synchronous wrappers (`SyncProducer`, `SyncConsumer`, `SyncAdminClient`).

| module | job |
|---|---|
| `transport.py` | bootstrap URLs, the aiohttp session, typed errors; cached metadata (leaders) |
| `producer.py` | batching, ordered, idempotent, retrying `Producer` |
| `consumer.py` | long-polling `Consumer`: positions, seek, group commits |
| `columns.py` | `RecordColumns`: a batch's records as columns, for `Consumer.poll_columns` |
| `admin.py` | `AdminClient`: topics, metadata, groups |
| `groups.py` | `GroupMembership`: join + heartbeat task behind `Consumer.subscribe` |
| `exactly_once.py` | consume-transform-produce with the input position in the output headers |
| `sync.py` | `Sync*` wrappers: the asyncio clients on a loop in a daemon thread |

`from http_api.client import Producer, Consumer, AdminClient` is the public entry point.
"""
from http_api.client.admin import AdminClient
from http_api.client.columns import BytesColumn, RecordColumns
from http_api.client.consumer import Consumer, ConsumerRecord
from http_api.client.producer import Producer, RecordMetadata
from http_api.client.sync import SyncAdminClient, SyncConsumer, SyncProducer
from http_api.client.transport import DEFAULT_URL, default_bootstrap

__all__ = ["AdminClient", "BytesColumn", "Consumer", "ConsumerRecord", "RecordColumns", "Producer", "RecordMetadata",
           "SyncAdminClient", "SyncConsumer", "SyncProducer", "DEFAULT_URL", "default_bootstrap"]
