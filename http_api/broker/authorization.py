"""Authorization of every broker route, in one table (Kafka's ACL operations per request).

`ROUTES` maps (method, route pattern) to the rule its requests must pass; `BrokerAuthorizer`
applies it after authentication (http_api/wire/auth.py). A route missing from the table is
refused (fail closed), and tests/functional/test_auth_routes.py walks the app's router so a
new route without an entry fails the suite.

Rules follow Kafka's request authorization:
- produce: WRITE topic (a produce that auto-creates the topic also needs CREATE, on the
  cluster or the topic); fetch: READ topic; offsets: DESCRIBE topic; delete-records: DELETE topic;
- topic create: CREATE on the cluster or on the topic; delete: DELETE; partitions: ALTER;
  configs: ALTER_CONFIGS; describe: DESCRIBE (the answer carries the configs);
- metadata and listings: no permission needed, but they show only the topics (groups) the
  principal may DESCRIBE;
- groups: join/heartbeat/leave READ group; offset commit READ group + READ each topic
  committed; offset fetch, describe and coordinator DESCRIBE group; delete DELETE group;
- producer ids: IDEMPOTENT_WRITE on the cluster, or WRITE on some topic (Kafka 3);
- /metrics and admin reads: DESCRIBE cluster; admin changes (users, ACLs, log cleaner runs):
  ALTER cluster; /internal/: CLUSTER_ACTION, and a replica fetch only from the broker its
  `replica_id` names;
- /healthz, /openapi.json and the web console's static assets are open (no authentication);
  console pages need what their data needs (overview and group list: any authenticated principal).
Super users and broker principals (`User:broker-<id>`) may do everything. With
authentication on but no authorizer, every authenticated principal may do everything except
/internal/ (brokers and super users only). With no authentication: no check here (the
/internal/ routes keep the cluster secret's token, http_api/broker/internal_auth.py).

403 answers name the missing permission and the command that grants it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Iterable, Optional

from aiohttp import web

from http_api.wire import codecs
from http_api.wire.auth import ANONYMOUS, SecurityImageLike, broker_id_of
from metadata_quorum.security.acl import Authorizer, Operation, ResourceType
from metadata_quorum.security.config import SecurityConfig
from partitions.errors import ErrorCode, KraftlogError

Op, RT = Operation, ResourceType
CLUSTER = "kafka-cluster"
# the console's static assets are public (its pages and data are not): http_api/console STATIC_PATHS
OPEN_ROUTES = frozenset({"/healthz", "/openapi.json", "/ui/static/console.js", "/ui/static/console.css"})

_CODE = {RT.TOPIC: ErrorCode.TOPIC_AUTHORIZATION_FAILED, RT.GROUP: ErrorCode.GROUP_AUTHORIZATION_FAILED,
         RT.CLUSTER: ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
         RT.TRANSACTIONAL_ID: ErrorCode.CLUSTER_AUTHORIZATION_FAILED}
_FLAG = {RT.TOPIC: "--topic", RT.GROUP: "--group", RT.CLUSTER: "--cluster"}


@dataclass(frozen=True)
class Need:
    """One permission: `operation` on the resource of `resource_type` named by the path
    parameter `param` (None: the cluster)."""

    operation: Operation
    resource_type: ResourceType
    param: Optional[str] = None

    def name(self, request: web.Request) -> str:
        return request.match_info[self.param] if self.param else CLUSTER


@dataclass(frozen=True)
class Rule:
    """What a route needs: every permission of `needs`; `check` for what the path cannot say
    (the body, the image); `listing` filters the answer to what the principal may DESCRIBE."""

    needs: tuple[Need, ...] = ()
    check: Optional[Callable[["BrokerAuthorizer", web.Request, str], Awaitable[None]]] = None
    listing: Optional[Callable[["BrokerAuthorizer", str, Any], Any]] = None


# ---- checks that read the body or the image ---------------------------------------------

async def _document(request: web.Request) -> Any:
    """The request's JSON or CBOR document as its handler will read it (aiohttp keeps the
    body), or None when it is not one (the handler answers 400 then)."""
    try:
        body = await request.read()
        return codecs.decode_document(request.headers.get("Content-Type") or codecs.JSON, body) if body else None
    except KraftlogError:
        return None


async def _create_topic(az: "BrokerAuthorizer", request: web.Request, principal: str) -> None:
    """CREATE on the cluster, else on the topic named in the body."""
    if az.allowed(principal, Op.CREATE, RT.CLUSTER, CLUSTER):
        return
    doc = await _document(request)
    name = doc["name"] if isinstance(doc, dict) and isinstance(doc.get("name"), str) else CLUSTER
    if name == CLUSTER:
        az.require(principal, Op.CREATE, RT.CLUSTER, CLUSTER)
    az.require(principal, Op.CREATE, RT.TOPIC, name)


async def _produce_auto_create(az: "BrokerAuthorizer", request: web.Request, principal: str) -> None:
    """A produce to a topic that does not exist auto-creates it: CREATE needed too."""
    topic = request.match_info["topic"]
    img = az.metadata_image()
    if img is not None and topic not in img.topics and not az.allowed(principal, Op.CREATE, RT.CLUSTER, CLUSTER):
        az.require(principal, Op.CREATE, RT.TOPIC, topic)


async def _commit_offsets(az: "BrokerAuthorizer", request: web.Request, principal: str) -> None:
    """READ on every topic whose offsets are committed (Kafka's OffsetCommit)."""
    doc = await _document(request)
    offsets = doc.get("offsets") if isinstance(doc, dict) else None
    for o in offsets if isinstance(offsets, list) else ():
        if isinstance(o, dict) and isinstance(o.get("topic"), str):
            az.require(principal, Op.READ, RT.TOPIC, o["topic"])


async def _stream_topics(az: "BrokerAuthorizer", request: web.Request, principal: str) -> None:
    """A group stream reads every topic it names (?topics=a,b): READ on each."""
    for t in sorted({t for t in request.query.get("topics", "").split(",") if t}):
        az.require(principal, Op.READ, RT.TOPIC, t)


async def _producer_ids(az: "BrokerAuthorizer", request: web.Request, principal: str) -> None:
    """IDEMPOTENT_WRITE on the cluster, or WRITE on any topic (Kafka 3's InitProducerId)."""
    if az.allowed(principal, Op.IDEMPOTENT_WRITE, RT.CLUSTER, CLUSTER):
        return
    img = az.metadata_image()
    for t in (img.topics if img is not None else ()):
        if az.allowed(principal, Op.WRITE, RT.TOPIC, t):
            return
    az.require(principal, Op.IDEMPOTENT_WRITE, RT.CLUSTER, CLUSTER)


async def _replica_fetch(az: "BrokerAuthorizer", request: web.Request, principal: str) -> None:
    """A follower fetches as itself: `replica_id` must be the authenticated broker's id (a
    broker fetching as another would move the other's ISR bookkeeping)."""
    me = broker_id_of(principal)
    doc = await _document(request)
    try:
        replica_id = int(doc["replica_id"])
    except (ValueError, KeyError, TypeError):
        replica_id = None   # no replica id: refused below (a broker always names itself)
    if me is None or me != replica_id:
        who = f"broker {me}" if me is not None else principal
        raise KraftlogError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                            f"{who} may not fetch as replica {replica_id}: a replica fetch must come from the broker "
                            f"it names (authenticate as User:broker-{replica_id})")


async def _txn_records(az: "BrokerAuthorizer", request: web.Request, principal: str) -> None:
    """WRITE on every topic a transactional produce writes to (Kafka's Produce/AddPartitionsToTxn)."""
    doc = await _document(request)
    records = doc.get("records") if isinstance(doc, dict) else None
    for t in sorted({r["topic"] for r in (records if isinstance(records, list) else ())
                     if isinstance(r, dict) and isinstance(r.get("topic"), str)}):
        az.require(principal, Op.WRITE, RT.TOPIC, t)


async def _txn_offsets(az: "BrokerAuthorizer", request: web.Request, principal: str) -> None:
    """READ on the group the offsets go to (Kafka's AddOffsetsToTxn / TxnOffsetCommit)."""
    doc = await _document(request)
    group = doc.get("group") if isinstance(doc, dict) else None
    if isinstance(group, str):
        az.require(principal, Op.READ, RT.GROUP, group)


# ---- listings ----------------------------------------------------------------------------

def _topic_names(az: "BrokerAuthorizer", principal: str, doc: Any) -> Any:
    doc["topics"] = az.describable(principal, RT.TOPIC, doc.get("topics", []))
    return doc


def _topic_objects(az: "BrokerAuthorizer", principal: str, doc: Any) -> Any:
    topics = doc.get("topics", [])
    keep = set(az.describable(principal, RT.TOPIC, [t.get("name") for t in topics]))
    doc["topics"] = [t for t in topics if t.get("name") in keep]
    return doc


def _group_objects(az: "BrokerAuthorizer", principal: str, doc: Any) -> Any:
    groups = doc.get("groups", [])
    keep = set(az.describable(principal, RT.GROUP, [g.get("group_id") for g in groups]))
    doc["groups"] = [g for g in groups if g.get("group_id") in keep]
    return doc


T, G, X = "topic", "group", "txid"
ROUTES: dict[tuple[str, str], Rule] = {
    ("GET", "/v1/metadata"): Rule(listing=_topic_objects),
    ("GET", "/v1/topics"): Rule(listing=_topic_names),
    ("POST", "/v1/topics"): Rule(check=_create_topic),
    ("GET", "/v1/topics/{topic}"): Rule((Need(Op.DESCRIBE, RT.TOPIC, T),)),
    ("DELETE", "/v1/topics/{topic}"): Rule((Need(Op.DELETE, RT.TOPIC, T),)),
    ("POST", "/v1/topics/{topic}/partitions"): Rule((Need(Op.ALTER, RT.TOPIC, T),)),
    ("POST", "/v1/topics/{topic}/configs"): Rule((Need(Op.ALTER_CONFIGS, RT.TOPIC, T),)),
    ("POST", "/v1/topics/{topic}/records"): Rule((Need(Op.WRITE, RT.TOPIC, T),), check=_produce_auto_create),
    ("POST", "/v1/topics/{topic}/partitions/{partition}/records"): Rule((Need(Op.WRITE, RT.TOPIC, T),)),
    ("GET", "/v1/topics/{topic}/partitions/{partition}/records"): Rule((Need(Op.READ, RT.TOPIC, T),)),
    ("GET", "/v1/topics/{topic}/partitions/{partition}/records/stream"): Rule((Need(Op.READ, RT.TOPIC, T),)),
    ("GET", "/v1/topics/{topic}/partitions/{partition}/offsets"): Rule((Need(Op.DESCRIBE, RT.TOPIC, T),)),
    ("POST", "/v1/topics/{topic}/partitions/{partition}/delete-records"): Rule((Need(Op.DELETE, RT.TOPIC, T),)),
    ("GET", "/v1/groups"): Rule(listing=_group_objects),
    ("GET", "/v1/groups/{group}"): Rule((Need(Op.DESCRIBE, RT.GROUP, G),)),
    ("DELETE", "/v1/groups/{group}"): Rule((Need(Op.DELETE, RT.GROUP, G),)),
    ("GET", "/v1/groups/{group}/coordinator"): Rule((Need(Op.DESCRIBE, RT.GROUP, G),)),
    ("POST", "/v1/groups/{group}/join"): Rule((Need(Op.READ, RT.GROUP, G),)),
    ("POST", "/v1/groups/{group}/heartbeat"): Rule((Need(Op.READ, RT.GROUP, G),)),
    ("POST", "/v1/groups/{group}/leave"): Rule((Need(Op.READ, RT.GROUP, G),)),
    ("POST", "/v1/groups/{group}/offsets"): Rule((Need(Op.READ, RT.GROUP, G),), check=_commit_offsets),
    ("GET", "/v1/groups/{group}/offsets"): Rule((Need(Op.DESCRIBE, RT.GROUP, G),)),
    ("GET", "/v1/groups/{group}/records/stream"): Rule((Need(Op.READ, RT.GROUP, G),), check=_stream_topics),
    ("POST", "/v1/producer-ids"): Rule(check=_producer_ids),
    # transactions: WRITE on the transactional id (Kafka's InitProducerId/EndTxn), plus the
    # topics written and the group whose offsets join the transaction
    ("POST", "/v1/transactions/{txid}/init"): Rule((Need(Op.WRITE, RT.TRANSACTIONAL_ID, X),)),
    ("POST", "/v1/transactions/{txid}/records"): Rule((Need(Op.WRITE, RT.TRANSACTIONAL_ID, X),), check=_txn_records),
    ("POST", "/v1/transactions/{txid}/offsets"): Rule((Need(Op.WRITE, RT.TRANSACTIONAL_ID, X),), check=_txn_offsets),
    ("POST", "/v1/transactions/{txid}/commit"): Rule((Need(Op.WRITE, RT.TRANSACTIONAL_ID, X),)),
    ("POST", "/v1/transactions/{txid}/abort"): Rule((Need(Op.WRITE, RT.TRANSACTIONAL_ID, X),)),
    # partition reassignment and decommission (Kafka's AlterPartitionReassignments: ALTER cluster)
    ("POST", "/v1/reassignments"): Rule((Need(Op.ALTER, RT.CLUSTER),)),
    ("GET", "/v1/reassignments"): Rule((Need(Op.DESCRIBE, RT.CLUSTER),)),
    ("DELETE", "/v1/reassignments"): Rule((Need(Op.ALTER, RT.CLUSTER),)),
    ("GET", "/v1/brokers"): Rule((Need(Op.DESCRIBE, RT.CLUSTER),)),
    ("POST", "/v1/brokers/{broker_id}/decommission"): Rule((Need(Op.ALTER, RT.CLUSTER),)),
    ("POST", "/v1/brokers/{broker_id}/recommission"): Rule((Need(Op.ALTER, RT.CLUSTER),)),
    # Confluent REST Proxy v2 (http_api/rest_proxy/): the same Kafka operations; consumer
    # instances READ the group (their fetches and commits are authorized as the client too)
    ("GET", "/topics"): Rule(),                         # the answer lists only DESCRIBE-able topics
    ("GET", "/topics/{topic}"): Rule((Need(Op.DESCRIBE, RT.TOPIC, T),)),
    ("GET", "/topics/{topic}/partitions"): Rule((Need(Op.DESCRIBE, RT.TOPIC, T),)),
    ("GET", "/topics/{topic}/partitions/{partition}"): Rule((Need(Op.DESCRIBE, RT.TOPIC, T),)),
    ("POST", "/topics/{topic}"): Rule((Need(Op.WRITE, RT.TOPIC, T),), check=_produce_auto_create),
    ("POST", "/topics/{topic}/partitions/{partition}"): Rule((Need(Op.WRITE, RT.TOPIC, T),)),
    ("POST", "/consumers/{group}"): Rule((Need(Op.READ, RT.GROUP, G),)),
    ("DELETE", "/consumers/{group}/instances/{instance}"): Rule((Need(Op.READ, RT.GROUP, G),)),
    ("POST", "/consumers/{group}/instances/{instance}/subscription"): Rule((Need(Op.READ, RT.GROUP, G),)),
    ("GET", "/consumers/{group}/instances/{instance}/subscription"): Rule((Need(Op.READ, RT.GROUP, G),)),
    ("DELETE", "/consumers/{group}/instances/{instance}/subscription"): Rule((Need(Op.READ, RT.GROUP, G),)),
    ("POST", "/consumers/{group}/instances/{instance}/assignments"): Rule((Need(Op.READ, RT.GROUP, G),)),
    ("GET", "/consumers/{group}/instances/{instance}/assignments"): Rule((Need(Op.READ, RT.GROUP, G),)),
    ("POST", "/consumers/{group}/instances/{instance}/positions"): Rule((Need(Op.READ, RT.GROUP, G),)),
    ("POST", "/consumers/{group}/instances/{instance}/positions/beginning"): Rule((Need(Op.READ, RT.GROUP, G),)),
    ("POST", "/consumers/{group}/instances/{instance}/positions/end"): Rule((Need(Op.READ, RT.GROUP, G),)),
    ("GET", "/consumers/{group}/instances/{instance}/records"): Rule((Need(Op.READ, RT.GROUP, G),)),
    ("POST", "/consumers/{group}/instances/{instance}/offsets"): Rule((Need(Op.READ, RT.GROUP, G),)),
    ("GET", "/consumers/{group}/instances/{instance}/offsets"): Rule((Need(Op.DESCRIBE, RT.GROUP, G),)),
    ("POST", "/admin/v1/log-cleaner/run"): Rule((Need(Op.ALTER, RT.CLUSTER),)),
    ("GET", "/admin/v1/log-cleaner"): Rule((Need(Op.DESCRIBE, RT.CLUSTER),)),
    ("GET", "/metrics"): Rule((Need(Op.DESCRIBE, RT.CLUSTER),)),
    # web console (http_api/console/): page shells, each needing what its data needs (that data
    # comes through the routes above: overview and group list show what the principal may
    # DESCRIBE); this broker's log dirs as Kafka's DescribeLogDirs
    ("GET", "/ui"): Rule(),
    ("GET", "/ui/"): Rule(),
    ("GET", "/ui/topics/{topic}"): Rule((Need(Op.DESCRIBE, RT.TOPIC, T),)),
    ("GET", "/ui/groups"): Rule(),
    ("GET", "/ui/groups/{group}"): Rule((Need(Op.DESCRIBE, RT.GROUP, G),)),
    ("GET", "/ui/metrics"): Rule((Need(Op.DESCRIBE, RT.CLUSTER),)),
    ("GET", "/ui/api/log-dirs"): Rule((Need(Op.DESCRIBE, RT.CLUSTER),)),
    ("POST", "/internal/v1/replica-fetch"): Rule((Need(Op.CLUSTER_ACTION, RT.CLUSTER),), check=_replica_fetch),
    ("POST", "/internal/v1/epoch-end-offsets"): Rule((Need(Op.CLUSTER_ACTION, RT.CLUSTER),)),
    ("GET", "/internal/v1/groups"): Rule((Need(Op.CLUSTER_ACTION, RT.CLUSTER),)),
    ("POST", "/internal/v1/txn-markers"): Rule((Need(Op.CLUSTER_ACTION, RT.CLUSTER),)),
    ("POST", "/internal/v1/transactions/{txid}/verify"): Rule((Need(Op.CLUSTER_ACTION, RT.CLUSTER),)),
}
# every route under these prefixes: reads DESCRIBE the cluster, changes ALTER it (Kafka's
# DescribeAcls/CreateAcls and the SCRAM credential APIs); /internal/: CLUSTER_ACTION
ADMIN_PREFIXES = ("/v1/admin/",)    # users, tokens, ACLs (http_api/broker/security_admin.py)
INTERNAL_PREFIX = "/internal/"
_READ_METHODS = frozenset({"GET", "HEAD"})


def rule_for(method: str, pattern: str) -> Optional[Rule]:
    """The rule of a route (its method and aiohttp canonical pattern), or None (refused).
    HEAD is GET without the body."""
    method = "GET" if method == "HEAD" else method
    rule = ROUTES.get((method, pattern))
    if rule is not None:
        return rule
    if pattern.startswith(INTERNAL_PREFIX):
        return Rule((Need(Op.CLUSTER_ACTION, RT.CLUSTER),))
    if pattern.startswith(ADMIN_PREFIXES):
        return Rule((Need(Op.DESCRIBE if method in _READ_METHODS else Op.ALTER, RT.CLUSTER),))
    return None


def grant_hint(principal: str, operation: Operation, resource_type: ResourceType, name: str) -> str:
    what = "the cluster" if resource_type is RT.CLUSTER else f"{resource_type.name.lower()} {name}"
    flag = _FLAG.get(resource_type, f"--{resource_type.name.lower()}")
    target = flag if resource_type is RT.CLUSTER else f"{flag} {name}"
    return (f"{principal} lacks {operation.name} on {what}; ask an admin: kraftlog acl add --principal {principal} "
            f"--operation {operation.name} {target}")


class BrokerAuthorizer:
    """Applies `ROUTES` for one broker: the ACLs and super users of the current SecurityImage
    (rebuilt when its version changes) plus the `super_users` setting."""

    def __init__(self, security: SecurityConfig, security_image: Callable[[], Optional[SecurityImageLike]],
                 metadata_image: Callable[[], Any] = lambda: None) -> None:
        self.security = security
        self.security_image = security_image
        self.metadata_image = metadata_image
        self.acl_on = security.authorizer == "acl"
        self._version: Any = object()
        self._authorizer = Authorizer((), security.super_users)

    def authorizer(self) -> Authorizer:
        img = self.security_image()
        version = None if img is None else (id(img), img.version)
        if version != self._version:
            self._authorizer = Authorizer(img.acls if img is not None else (), self.security.super_users)
            self._version = version
        return self._authorizer

    def is_cluster_principal(self, principal: str) -> bool:
        return broker_id_of(principal) is not None or principal in self.security.super_users

    def allowed(self, principal: str, operation: Operation, resource_type: ResourceType, name: str) -> bool:
        if self.is_cluster_principal(principal):
            return True
        if not self.acl_on:
            return operation is not Op.CLUSTER_ACTION
        return self.authorizer().authorize(principal, operation, resource_type, name)

    def require(self, principal: str, operation: Operation, resource_type: ResourceType, name: str) -> None:
        if not self.allowed(principal, operation, resource_type, name):
            raise KraftlogError(_CODE[resource_type], grant_hint(principal, operation, resource_type, name))

    def describable(self, principal: str, resource_type: ResourceType, names: Iterable[str]) -> list[str]:
        return [n for n in names if self.allowed(principal, Op.DESCRIBE, resource_type, n)]

    async def __call__(self, request: web.Request, principal: str):
        """The AuthMiddleware hook: raise 403 or return an answer filter (listings) or None."""
        if principal == ANONYMOUS and not self.security.secured:
            return None
        route = request.match_info.route
        resource = route.resource
        if resource is None:
            return None            # no such route: the app answers 404/405
        pattern = resource.canonical
        if pattern in OPEN_ROUTES:
            return None
        rule = rule_for(request.method, pattern)
        if rule is None:
            raise KraftlogError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                                f"{request.method} {pattern} has no authorization rule (a kraftlog bug: add it to "
                                "http_api/broker/authorization.py ROUTES); refused")
        for need in rule.needs:
            self.require(principal, need.operation, need.resource_type, need.name(request))
        if rule.check is not None:
            await rule.check(self, request, principal)
        if rule.listing is not None and not self.is_cluster_principal(principal):
            listing = rule.listing
            return lambda resp: filter_answer(resp, lambda doc: listing(self, principal, doc))
        return None


def filter_answer(resp: web.StreamResponse, fn: Callable[[Any], Any]) -> web.StreamResponse:
    """Rewrite a 200 JSON/CBOR answer's document with `fn` (listings)."""
    if not isinstance(resp, web.Response) or resp.status != 200 or resp.body is None:
        return resp
    media = codecs.media_type(resp.content_type)
    if media not in (codecs.JSON, codecs.CBOR):
        return resp
    doc = fn(codecs.decode_document(media, bytes(resp.body)))
    out = web.Response(body=codecs.encode_document(media, doc), status=resp.status, content_type=media)
    for k, v in resp.headers.items():
        if k.lower() not in ("content-type", "content-length"):
            out.headers[k] = v
    return out
