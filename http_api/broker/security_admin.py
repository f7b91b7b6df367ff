"""Security administration on every broker: users (SCRAM-SHA-256), bearer tokens, ACLs.

    GET    /v1/admin/users                     -> {"users": [{name, mechanism, iterations}]} (never a key)
    POST   /v1/admin/users                     {name, password | credential, iterations?} -> 201
    PUT    /v1/admin/users/{name}              {password | credential, iterations?} -> 200 (creates if missing)
    DELETE /v1/admin/users/{name}              -> 204
    GET    /v1/admin/tokens?principal=P        -> {"tokens": [{token_id, principal, issue_timestamp_ms, expiry_timestamp_ms}]}
    POST   /v1/admin/tokens                    {principal, lifetime_ms?} -> 201 {token, token_id, principal, expiry_timestamp_ms}
    DELETE /v1/admin/tokens/{token_id}         -> 204
    GET    /v1/admin/acls?principal=&resource_type=&resource_name=&pattern_type= -> {"acls": [binding]}
    POST   /v1/admin/acls                      binding | {"acls": [binding]} -> 201 {"acls": [...]}
    POST   /v1/admin/acls/delete               binding | {"acls": [binding]} -> 200 {"deleted": [...]}

A binding is {principal, resource_type (TOPIC|GROUP|CLUSTER|TRANSACTIONAL_ID), resource_name,
pattern_type (LITERAL|PREFIXED), operation, permission (ALLOW|DENY)}. Reads answer from this
broker's metadata (`MetadataView.security`); writes go to the controller and the answer
waits until this broker's metadata shows them. The password is turned into a salted SCRAM
credential here and only the credential travels on; a token is made here, returned once,
and only its SHA-256 travels on and is stored.
"""
from __future__ import annotations

import os

from aiohttp import web

from http_api.broker.context import Routes, json_response
from metadata_quorum.controller_security import new_token
from metadata_quorum.security import controller as sc
from metadata_quorum.security.scram import MECHANISM, SALT_BYTES
from partitions.errors import ErrorCode, KraftlogError


class SecurityAdminRoutes(Routes):
    """Users, tokens and ACLs; see the module docstring."""

    def install(self, router: web.UrlDispatcher) -> None:
        router.add_get("/v1/admin/users", self.list_users)
        router.add_post("/v1/admin/users", self.create_user)
        router.add_put("/v1/admin/users/{name}", self.alter_user)
        router.add_delete("/v1/admin/users/{name}", self.delete_user)
        router.add_get("/v1/admin/tokens", self.list_tokens)
        router.add_post("/v1/admin/tokens", self.create_token)
        router.add_delete("/v1/admin/tokens/{token_id}", self.delete_token)
        router.add_get("/v1/admin/acls", self.list_acls)
        router.add_post("/v1/admin/acls", self.create_acls)
        router.add_post("/v1/admin/acls/delete", self.delete_acls)

    @property
    def security(self):
        self.ctx.image   # BROKER_NOT_AVAILABLE before metadata is loaded
        return self.deps.metadata.security

    async def _object(self, request: web.Request, what: str) -> dict:
        doc = await self.ctx.read_document(request)
        if not isinstance(doc, dict):
            raise KraftlogError(ErrorCode.INVALID_REQUEST, f"body must be an object {what}")
        return doc

    async def _visible(self, answer: dict) -> None:
        """Wait until this broker's metadata has applied the controller's change."""
        offset = answer.get("metadata_offset", 0)
        seen = await self.deps.metadata.wait_until(lambda img: img.offset >= offset,
                                                   self.config.metadata_wait_ms / 1000)
        if not seen:
            raise KraftlogError(ErrorCode.REQUEST_TIMED_OUT,
                                f"the change was made but this broker has not seen it within "
                                f"{self.config.metadata_wait_ms} ms; check with a GET in a moment")

    @staticmethod
    def _credential(doc: dict) -> dict:
        unknown = set(doc) - {"name", "password", "credential", "iterations"}
        if unknown:
            raise KraftlogError(ErrorCode.INVALID_REQUEST, f"unknown field(s) {sorted(map(str, unknown))}; "
                                "allowed: name, password, credential, iterations")
        cred = sc.credential_from_request(doc.get("password"), doc.get("credential"), doc.get("iterations"),
                                          salt=os.urandom(SALT_BYTES))
        return cred.to_dict()

    # ------------------------------------------------------------------ users
    async def list_users(self, request: web.Request) -> web.Response:
        return json_response({"users": self.security.users_json()})

    async def create_user(self, request: web.Request) -> web.Response:
        doc = await self._object(request, "{name, password | credential, iterations?}")
        name = sc.validate_user_name(doc.get("name"))
        if name in self.security.scram_credentials:   # fail fast; the controller decides for good
            raise KraftlogError(ErrorCode.DUPLICATE_RESOURCE,
                                f"user {name} already exists; change its password with PUT /v1/admin/users/{name}")
        cred = self._credential(doc)
        await self._visible(await self.deps.controller.create_user(name, cred))
        return json_response({"name": name, "mechanism": MECHANISM, "iterations": cred["iterations"]}, status=201)

    async def alter_user(self, request: web.Request) -> web.Response:
        name = sc.validate_user_name(request.match_info["name"])
        doc = await self._object(request, "{password | credential, iterations?}")
        cred = self._credential(doc)
        await self._visible(await self.deps.controller.alter_user(name, cred))
        return json_response({"name": name, "mechanism": MECHANISM, "iterations": cred["iterations"]})

    async def delete_user(self, request: web.Request) -> web.Response:
        name = sc.validate_user_name(request.match_info["name"])
        await self._visible(await self.deps.controller.delete_user(name))
        return web.Response(status=204)

    # ------------------------------------------------------------------ tokens
    async def list_tokens(self, request: web.Request) -> web.Response:
        principal = request.query.get("principal")
        tokens = sorted(self.security.tokens.values(), key=lambda t: (t.issue_timestamp_ms, t.token_id))
        return json_response({"tokens": [t.to_json() for t in tokens
                                         if principal is None or t.principal == principal]})

    async def create_token(self, request: web.Request) -> web.Response:
        doc = await self._object(request, "{principal, lifetime_ms?}")
        unknown = set(doc) - {"principal", "lifetime_ms"}
        if unknown:
            raise KraftlogError(ErrorCode.INVALID_REQUEST, f"unknown field(s) {sorted(map(str, unknown))}; "
                                "allowed: principal, lifetime_ms")
        principal = sc.validate_principal(doc.get("principal"))
        lifetime = doc.get("lifetime_ms")
        if lifetime is not None and (isinstance(lifetime, bool) or not isinstance(lifetime, int) or lifetime <= 0):
            raise KraftlogError(ErrorCode.INVALID_REQUEST, f"lifetime_ms must be an integer > 0 or null, got {lifetime!r}")
        token, token_id, token_hash = new_token()
        answer = await self.deps.controller.create_token(principal, token_id, token_hash, lifetime)
        await self._visible(answer)
        return json_response({"token": token, "token_id": token_id, "principal": principal,
                              "expiry_timestamp_ms": answer.get("expiry_timestamp_ms")}, status=201)

    async def delete_token(self, request: web.Request) -> web.Response:
        await self._visible(await self.deps.controller.delete_token(request.match_info["token_id"]))
        return web.Response(status=204)

    # ------------------------------------------------------------------ ACLs
    async def list_acls(self, request: web.Request) -> web.Response:
        found = self.security.acls_matching(**sc.acl_filter(request.query))
        return json_response({"acls": [b.to_dict() for b in found]})

    async def create_acls(self, request: web.Request) -> web.Response:
        bindings = sc.parse_bindings(await self._object(request, "(an ACL binding or {\"acls\": [...]})"))
        sc.create_acls(self.security, bindings)   # fail fast on a duplicate; the controller decides for good
        docs = [b.to_dict() for b in bindings]
        await self._visible(await self.deps.controller.create_acls(docs))
        return json_response({"acls": docs}, status=201)

    async def delete_acls(self, request: web.Request) -> web.Response:
        bindings = sc.parse_bindings(await self._object(request, "(an ACL binding or {\"acls\": [...]})"))
        docs = [b.to_dict() for b in bindings]
        await self._visible(await self.deps.controller.delete_acls(docs))
        return json_response({"deleted": docs})
