"""The broker's public HTTP API (API.md "Broker HTTP API v1") as an aiohttp app.

`create_app(config, deps)` builds the app from a `BrokerConfig` and injected dependencies
(`BrokerDeps`: replica manager, metadata view, controller client, group offset store), so
functional tests run it in-process with a fake controller and the broker process
(`server.py`) wires the real ones. The handlers live in route classes by concern
(`topics`, `produce`, `fetch`, `replica`, `groups`, `log_cleaner`, `ops`) over one shared
`BrokerContext` (`context.py`); the table below is the whole API.

Routing rules: partition-level produce/fetch/offsets answer only on the partition leader
(else 421 NOT_LEADER_OR_FOLLOWER with leader_id/leader_url); topic-level produce works on
any broker and forwards each partition's batch to its leader as a raw batch; admin routes
go to the controller. Bad input is rejected with a 4xx before anything is stored.
"""
from __future__ import annotations

import logging

from aiohttp import web
import aiohttp

from http_api.broker.authorization import OPEN_ROUTES, BrokerAuthorizer
from http_api.broker.config import BrokerConfig
from http_api.broker.context import BrokerContext, BrokerDeps
from http_api.broker.fetch import FetchRoutes
from http_api.broker.groups import install_group_routes
from http_api.broker.internal_auth import INTERNAL_PATH_PREFIX, INTERNAL_TOKEN_HEADER, token_ok
from http_api.broker.log_cleaner import install_log_cleaner_routes
from http_api.broker.ops import OpsRoutes
from http_api.broker.produce import ProduceRoutes
from http_api.broker.replica import ReplicaRoutes
from http_api.broker.reassignments import ReassignmentRoutes
from http_api.broker.quorum_admin import QuorumAdminRoutes
from http_api.broker.security_admin import SecurityAdminRoutes
from http_api.broker.streaming import install_streaming
from http_api.broker.tiering import install_tiered_storage
from http_api.broker.topics import TopicRoutes
from http_api.broker.transactions import install_transaction_routes
from http_api.console import install_console
from http_api.rest_proxy import install_rest_proxy
from http_api.wire.auth import AuthMiddleware, Authenticator, register_auth_metrics
from http_api.wire.middleware import CLIENT_ID_HEADER, ErrorMiddleware
from partitions.errors import ErrorCode, KraftlogError

__all__ = ["BROKER_KEY", "BrokerDeps", "create_app"]

log = logging.getLogger("kraftlog.broker")

CORRELATION_HEADER = "X-Correlation-Id"
BROKER_KEY: web.AppKey = web.AppKey("broker", object)


def _admit(request: web.Request) -> None:
    """Before every handler: a debug line naming the client; /internal/ routes need the token
    of the cluster secret."""
    client_id = request.headers.get(CLIENT_ID_HEADER)
    if client_id and log.isEnabledFor(logging.DEBUG):
        log.debug("%s %s client_id=%s correlation_id=%s", request.method, request.path, client_id,
                  request.headers.get(CORRELATION_HEADER))
    if request.path.startswith(INTERNAL_PATH_PREFIX) and not token_ok(
            request.app[BROKER_KEY].internal_token, request.headers.get(INTERNAL_TOKEN_HEADER)):
        raise KraftlogError(ErrorCode.SASL_AUTHENTICATION_FAILED,
                            f"{request.path} is for the brokers of this cluster: the request lacks the token "
                            "of the cluster secret (set the same `password` on every node)")


def _http_error(request: web.Request, e: web.HTTPException) -> KraftlogError:
    """aiohttp's own errors: a body over client_max_size is RECORD_LIST_TOO_LARGE, a missing
    route points at /openapi.json."""
    code = ErrorCode.RECORD_LIST_TOO_LARGE if e.status == 413 else ErrorCode.INVALID_REQUEST
    msg = (f"no route {request.method} {request.path}; see GET /openapi.json" if e.status in (404, 405)
           else e.reason)
    return KraftlogError(code, msg)


_ERRORS = ErrorMiddleware(
    log, unexpected_log="unhandled error in {method} {path} (client_id={client_id})",
    http_error=_http_error,
    internal_error=lambda e: f"internal error: {type(e).__name__}: {e}; see the broker log",
    admit=_admit, echo_headers=(CORRELATION_HEADER,))


def create_app(config: BrokerConfig, deps: BrokerDeps) -> web.Application:
    """The broker aiohttp app; `deps` are injected (real in server.py, fakes in tests).

    Every request is authenticated and authorized first (http_api/wire/auth.py, the route
    table of http_api/broker/authorization.py) under the `[security]` settings."""
    ctx = BrokerContext(config, deps)
    security_image = deps.security_image or (lambda: deps.metadata.security)
    authenticator = Authenticator(config.security, security_image)
    authorizer = BrokerAuthorizer(config.security, security_image, lambda: deps.metadata.image)
    auth = AuthMiddleware(authenticator, authorizer, open_paths=OPEN_ROUTES, echo_headers=(CORRELATION_HEADER,))
    app = web.Application(middlewares=[auth, _ERRORS], client_max_size=config.socket_request_max_bytes)
    ctx.authenticator, ctx.authorizer = authenticator, authorizer
    register_auth_metrics(deps.registry, authenticator)
    app[BROKER_KEY] = ctx
    topics, produce, fetch = TopicRoutes(ctx), ProduceRoutes(ctx), FetchRoutes(ctx)
    replica, ops = ReplicaRoutes(ctx), OpsRoutes(ctx)
    r = app.router
    r.add_get("/v1/metadata", topics.get_metadata)
    r.add_get("/v1/topics", topics.list_topics)
    r.add_post("/v1/topics", topics.create_topic)
    r.add_get("/v1/topics/{topic}", topics.describe_topic)
    r.add_delete("/v1/topics/{topic}", topics.delete_topic)
    r.add_post("/v1/topics/{topic}/partitions", topics.create_partitions)
    r.add_post("/v1/topics/{topic}/configs", topics.alter_configs)
    r.add_post("/v1/topics/{topic}/records", produce.produce_topic)
    r.add_post("/v1/topics/{topic}/partitions/{partition}/records", produce.produce_partition)
    r.add_get("/v1/topics/{topic}/partitions/{partition}/records", fetch.fetch)
    r.add_get("/v1/topics/{topic}/partitions/{partition}/offsets", fetch.offsets)
    r.add_post("/v1/topics/{topic}/partitions/{partition}/delete-records", fetch.delete_records)
    install_streaming(app, ctx, stream_buffer_bytes=ctx.config.stream_buffer_bytes,
                      heartbeat_ms=ctx.config.stream_heartbeat_ms)                          # SSE: .../records/stream (streaming.py)
    install_rest_proxy(app, ctx, consumer_instance_timeout_ms=ctx.config.consumer_instance_timeout_ms)                         # Confluent REST Proxy v2: /topics, /consumers (rest_proxy/)
    install_group_routes(app, ctx, deps.clock)           # consumer groups: /v1/groups...
    install_transaction_routes(app, ctx, deps.clock)     # transactions: /v1/transactions/{txid}/...
    r.add_post("/v1/producer-ids", produce.init_producer_id)
    install_log_cleaner_routes(app, ctx)                 # /admin/v1/log-cleaner...
    SecurityAdminRoutes(ctx).install(r)                  # /v1/admin/users, /tokens, /acls
    ReassignmentRoutes(ctx).install(r)                   # /v1/reassignments, /v1/brokers (KIP-455, decommission)
    QuorumAdminRoutes(ctx).install(r)                    # /v1/admin/quorum (controller voters, quorum_admin.py)
    install_tiered_storage(app, ctx)                     # [remote_storage]: remote log manager (tiering.py)
    r.add_post("/internal/v1/replica-fetch", replica.replica_fetch)
    r.add_post("/internal/v1/epoch-end-offsets", replica.epoch_end_offsets)
    r.add_get("/healthz", ops.healthz)
    r.add_get("/metrics", ops.metrics_handler)
    r.add_get("/openapi.json", ops.openapi)
    install_console(app, ctx)                            # web console: /ui/ (http_api/console/)

    async def _session(app: web.Application):
        own = deps.http_session is None
        if own:
            # forwarding and internal listings authenticate as this broker (auth.broker_auth_headers)
            deps.http_session = aiohttp.ClientSession(headers=ctx.internal_headers)
        yield
        if own and deps.http_session is not None:
            await deps.http_session.close()
            deps.http_session = None

    app.cleanup_ctx.append(_session)
    return app
