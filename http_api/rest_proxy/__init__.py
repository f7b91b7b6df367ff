"""The Confluent REST Proxy API v2 on every broker (API.md "Console and streaming"), for the
HTTP clients, scripts and libraries that speak it. Routes and media types as Confluent
documents them:

  GET  /topics                                   ["t1", ...]   (internal `__` topics left out)
  GET  /topics/{t}                               {"name", "configs", "partitions": [...]}
  GET  /topics/{t}/partitions[/{p}]              {"partition", "leader", "replicas": [{"broker","leader","in_sync"}]}
  POST /topics/{t}[/partitions/{p}]              Content-Type application/vnd.kafka.{json|binary}.v2+json,
                                                 {"records": [{"key"?, "value", "partition"?}]} ->
                                                 {"offsets": [{"partition","offset","error_code","error"}],
                                                  "key_schema_id": null, "value_schema_id": null}
  POST   /consumers/{g}                          {"name"?, "format"? binary|json, "auto.offset.reset"?,
                                                  "auto.commit.enable"?, "consumer.request.timeout.ms"?}
                                                 -> {"instance_id", "base_uri"}
  DELETE /consumers/{g}/instances/{i}
  POST|GET|DELETE .../subscription               {"topics": [...]} or {"topic_pattern": "re"}
  POST|GET .../assignments                       {"partitions": [{"topic","partition"}]}
  POST .../positions                             {"offsets": [{"topic","partition","offset"}]}  (seek)
  POST .../positions/beginning|end               {"partitions": [...]}
  GET  .../records?timeout=&max_bytes=           Accept application/vnd.kafka.{format}.v2+json ->
                                                 [{"topic","key","value","partition","offset"}]
  POST .../offsets                               {"offsets": [{"topic","partition","offset"}]} commits
                                                 offset + 1 of each (the last consumed); no body: the
                                                 positions of everything read
  GET  .../offsets                               body {"partitions": [...]} -> {"offsets": [{..., "metadata"}]}

Errors are `{"error_code", "message"}` with Confluent's codes (errors.py): 40401 topic not
found, 40402 partition not found, 40403 consumer instance not found, 40601 the records'
embedded format is not the instance's, 406 / 415 media types, 40902 instance already exists,
40903 subscription and assignment mixed (illegal state), 422xx invalid input. Answers are
`application/vnd.kafka.v2+json` (records: the instance's embedded format). The `json`
embedded format stores a key/value as its JSON text (UTF-8), `binary` as the bytes of its
base64; avro/protobuf/jsonschema (they need a schema registry) are refused with 415.

Consumer instances (consumers.py) live on the broker that created them (their `base_uri`)
and are kraftlog consumers of the existing group coordinator and committed offsets;
authentication and ACLs are the broker's (http_api/broker/authorization.py): produce needs
WRITE on the topic, instances READ on the group and (through the fetches they make for the
client's principal) READ on the topics.
"""
from __future__ import annotations

from aiohttp import web

from http_api.rest_proxy.consumers import CONSUMER_INSTANCE_TIMEOUT_MS, ConsumerInstances
from http_api.rest_proxy.routes import RestProxyRoutes

REST_PROXY_KEY: web.AppKey = web.AppKey("rest_proxy", object)


def install_rest_proxy(app: web.Application, ctx, *,
                       consumer_instance_timeout_ms: int = CONSUMER_INSTANCE_TIMEOUT_MS) -> RestProxyRoutes:
    """Add the v2 routes to a broker app; idle consumer instances expire while it runs."""
    instances = ConsumerInstances(consumer_instance_timeout_ms)
    routes = RestProxyRoutes(ctx, instances)
    app[REST_PROXY_KEY] = routes
    r = app.router
    r.add_get("/topics", routes.list_topics)
    r.add_get("/topics/{topic}", routes.describe_topic)
    r.add_post("/topics/{topic}", routes.produce_topic)
    r.add_get("/topics/{topic}/partitions", routes.list_partitions)
    r.add_get("/topics/{topic}/partitions/{partition}", routes.describe_partition)
    r.add_post("/topics/{topic}/partitions/{partition}", routes.produce_partition)
    r.add_post("/consumers/{group}", routes.create_instance)
    i = "/consumers/{group}/instances/{instance}"
    r.add_delete(i, routes.delete_instance)
    r.add_post(i + "/subscription", routes.subscribe)
    r.add_get(i + "/subscription", routes.subscription)
    r.add_delete(i + "/subscription", routes.unsubscribe)
    r.add_post(i + "/assignments", routes.assign)
    r.add_get(i + "/assignments", routes.assignments)
    r.add_post(i + "/positions", routes.seek)
    r.add_post(i + "/positions/beginning", routes.seek_beginning)
    r.add_post(i + "/positions/end", routes.seek_end)
    r.add_get(i + "/records", routes.records)
    r.add_post(i + "/offsets", routes.commit)
    r.add_get(i + "/offsets", routes.committed)

    async def _run(app: web.Application):
        instances.start()
        yield
        await instances.stop()

    app.cleanup_ctx.append(_run)
    return routes


__all__ = ["REST_PROXY_KEY", "install_rest_proxy"]
