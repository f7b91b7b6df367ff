"""The controller's security routes and the bootstrap of users (the IO shell around
metadata_quorum/security/controller.py).

Routes (prefix /controller/v1, JSON; writes go to the active controller, carry a request id
and answer "metadata_offset", the offset a broker waits for before answering its client):

    GET    /security/users                 -> {"users": [{name, mechanism, iterations}]}   (never a key)
    POST   /security/users                 {name, password | credential, iterations?} -> 201
    PUT    /security/users/{name}          {password | credential, iterations?} -> 200 (upsert)
    DELETE /security/users/{name}          -> {"deleted": name}
    GET    /security/tokens                -> {"tokens": [{token_id, principal, issue_timestamp_ms, expiry_timestamp_ms}]}
    POST   /security/tokens                {principal, lifetime_ms?, token_hash?, token_id?} -> 201
    DELETE /security/tokens/{token_id}     -> {"deleted": token_id}
    GET    /security/acls?principal=&resource_type=&resource_name=&pattern_type= -> {"acls": [...]}
    POST   /security/acls                  binding | {"acls": [binding, ...]} -> 201 {"acls": [...]}
    POST   /security/acls/delete           binding | {"acls": [...]} -> {"deleted": [...]}

A password is turned into a salted SCRAM-SHA-256 credential here and never stored nor
logged; brokers send the credential already derived (and a token's hash, never the token),
so their retries are idempotent. A token created here without `token_hash` is returned once
in the answer ("token") and only its SHA-256 is stored.

Maintenance (the controller's loop): expired tokens are removed. Bootstrap: with
`ControllerConfig.security.bootstrap_users_file` (the `[security]` setting
`bootstrap_users_file`: JSON {user: password or credential}), the active controller writes a
credential for every listed user missing from the image, once per term.
"""
from __future__ import annotations

import json
import logging
import os
import secrets
from typing import Any, Awaitable, Callable, Optional

from aiohttp import web

from metadata_quorum.security import controller as sc
from metadata_quorum.security.scram import SALT_BYTES, hash_token
from partitions.errors import ErrorCode, KraftlogError

log = logging.getLogger("kraftlog.controller.security")

TOKEN_BYTES = 32


def new_token() -> tuple[str, str, str]:
    """(token, token_id, token_hash) of a fresh random bearer token."""
    token = secrets.token_urlsafe(TOKEN_BYTES)
    return token, secrets.token_hex(8), hash_token(token)


def credential_from_body(body: dict):
    """The SCRAM credential a body asks for (a fresh random salt when it gives a password)."""
    return sc.credential_from_request(body.get("password"), body.get("credential"), body.get("iterations"),
                                      salt=os.urandom(SALT_BYTES))


def load_bootstrap_users(path: str) -> dict:
    """{user: ScramCredential} from a JSON file {user: password or credential object};
    ValueError saying what is wrong (never echoing a password)."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"bootstrap_users_file {path!r} cannot be read as JSON: {type(e).__name__}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"bootstrap_users_file {path!r} must hold an object {{user: password or credential}}")
    out = {}
    for name, value in doc.items():
        body = {"password": value} if isinstance(value, str) else {"credential": value}
        try:
            sc.validate_user_name(name)
            out[name] = credential_from_body(body)
        except KraftlogError as e:
            raise ValueError(f"bootstrap_users_file {path!r}, user {name!r}: {e.message}") from None
    return out


class ControllerSecurityRoutes:
    """Security handlers and the users bootstrap of one ControllerServer."""

    def __init__(self, server: Any, bootstrap_users_file: Optional[str],
                 json_body: Callable[[web.Request], Awaitable[dict]],
                 request_id: Callable[[web.Request, dict], Optional[str]]) -> None:
        """`server`: the ControllerServer (its state machine, `write`, `is_active`, clock);
        `json_body` and `request_id`: its body and request id readers."""
        self.server = server
        self._json_body = json_body
        self._request_id = request_id
        self.bootstrap_users_file = bootstrap_users_file
        self._bootstrapped_term: Optional[int] = None

    def install(self, router: web.UrlDispatcher, prefix: str) -> None:
        p = prefix + "/security"
        router.add_get(p + "/users", self.h_list_users)
        router.add_post(p + "/users", self.h_create_user)
        router.add_put(p + "/users/{name}", self.h_alter_user)
        router.add_delete(p + "/users/{name}", self.h_delete_user)
        router.add_get(p + "/tokens", self.h_list_tokens)
        router.add_post(p + "/tokens", self.h_create_token)
        router.add_delete(p + "/tokens/{token_id}", self.h_delete_token)
        router.add_get(p + "/acls", self.h_list_acls)
        router.add_post(p + "/acls", self.h_create_acls)
        router.add_post(p + "/acls/delete", self.h_delete_acls)

    # ------------------------------------------------------------------ helpers
    @property
    def _security(self):
        return self.server.sm.image.security

    async def _write(self, request: web.Request, body: dict, decide) -> int:
        result = await self.server.write(lambda img: decide(img.security), self._request_id(request, body))
        return result.get("offset", self.server.sm.image.offset)

    # ------------------------------------------------------------------ users
    async def h_list_users(self, request: web.Request) -> web.Response:
        sec = self._security
        return web.json_response({"users": sec.users_json(), "security_version": sec.version})

    async def h_create_user(self, request: web.Request) -> web.Response:
        body = await self._json_body(request)
        name = sc.validate_user_name(body.get("name"))
        cred = credential_from_body(body)
        offset = await self._write(request, body, lambda sec: sc.create_user(sec, name, cred))
        log.info("user %s created (SCRAM-SHA-256, %d iterations)", name, cred.iterations)
        return web.json_response({"name": name, "mechanism": "SCRAM-SHA-256", "iterations": cred.iterations,
                                  "metadata_offset": offset}, status=201)

    async def h_alter_user(self, request: web.Request) -> web.Response:
        name = sc.validate_user_name(request.match_info["name"])
        body = await self._json_body(request)
        cred = credential_from_body(body)
        offset = await self._write(request, body, lambda sec: sc.alter_user(sec, name, cred))
        log.info("user %s credential changed (SCRAM-SHA-256, %d iterations)", name, cred.iterations)
        return web.json_response({"name": name, "mechanism": "SCRAM-SHA-256", "iterations": cred.iterations,
                                  "metadata_offset": offset})

    async def h_delete_user(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        offset = await self._write(request, {}, lambda sec: sc.delete_user(sec, name))
        log.info("user %s deleted", name)
        return web.json_response({"deleted": name, "metadata_offset": offset})

    # ------------------------------------------------------------------ tokens
    async def h_list_tokens(self, request: web.Request) -> web.Response:
        principal = request.query.get("principal")
        tokens = [t.to_json() for t in sorted(self._security.tokens.values(), key=lambda t: t.issue_timestamp_ms)
                  if principal is None or t.principal == principal]
        return web.json_response({"tokens": tokens})

    async def h_create_token(self, request: web.Request) -> web.Response:
        body = await self._json_body(request)
        principal = sc.validate_principal(body.get("principal"))
        token: Optional[str] = None
        if body.get("token_hash") is None:
            token, token_id, token_hash = new_token()
        else:
            token_id, token_hash = body.get("token_id"), body.get("token_hash")
            if not (isinstance(token_hash, str) and len(token_hash) == 64 and isinstance(token_id, str)
                    and 0 < len(token_id) <= 64):
                raise KraftlogError(ErrorCode.INVALID_REQUEST,
                                    "token_hash must be the sha256 hex of the token and token_id a short string")
        now = self.server.clock.now_ms()
        lifetime = body.get("lifetime_ms")
        offset = await self._write(request, body, lambda sec: sc.create_token(sec, principal, token_id, token_hash,
                                                                              now, lifetime))
        t = self._security.tokens.get(token_id)
        out = {"token_id": token_id, "principal": principal,
               "expiry_timestamp_ms": t.expiry_timestamp_ms if t is not None else None, "metadata_offset": offset}
        if token is not None:
            out["token"] = token
        log.info("delegation token %s created for %s", token_id, principal)
        return web.json_response(out, status=201)

    async def h_delete_token(self, request: web.Request) -> web.Response:
        token_id = request.match_info["token_id"]
        offset = await self._write(request, {}, lambda sec: sc.delete_token(sec, token_id))
        log.info("delegation token %s deleted", token_id)
        return web.json_response({"deleted": token_id, "metadata_offset": offset})

    # ------------------------------------------------------------------ ACLs
    async def h_list_acls(self, request: web.Request) -> web.Response:
        sec = self._security
        return web.json_response({"acls": [b.to_dict() for b in sec.acls_matching(**sc.acl_filter(request.query))],
                                  "security_version": sec.version})

    async def h_create_acls(self, request: web.Request) -> web.Response:
        body = await self._json_body(request)
        bindings = sc.parse_bindings(body)
        offset = await self._write(request, body, lambda sec: sc.create_acls(sec, bindings))
        log.info("%d ACL(s) created", len(bindings))
        return web.json_response({"acls": [b.to_dict() for b in bindings], "metadata_offset": offset}, status=201)

    async def h_delete_acls(self, request: web.Request) -> web.Response:
        body = await self._json_body(request)
        bindings = sc.parse_bindings(body)
        offset = await self._write(request, body, lambda sec: sc.delete_acls(sec, bindings))
        log.info("%d ACL(s) deleted", len(bindings))
        return web.json_response({"deleted": [b.to_dict() for b in bindings], "metadata_offset": offset})

    # ------------------------------------------------------------------ maintenance
    async def maintenance(self) -> None:
        """The active controller's periodic security work: the users bootstrap, then the
        removal of expired tokens."""
        await self.bootstrap_if_needed()
        if not self.server.is_active:
            return
        now = self.server.clock.now_ms()
        if any(t.expired(now) for t in self._security.tokens.values()):
            result = await self.server.write(lambda img: sc.remove_expired_tokens(img.security, now))
            if not result.get("noop"):
                log.info("expired delegation tokens removed")

    async def bootstrap_if_needed(self) -> None:
        """On the active controller, once per term: create the users of
        `bootstrap_users_file` that the image lacks. Errors are logged (never the password)
        and retried on the next call."""
        if not self.bootstrap_users_file or not self.server.is_active:
            return
        term = self.server.sm.image.controller_epoch
        if self._bootstrapped_term == term:
            return
        try:
            users = load_bootstrap_users(self.bootstrap_users_file)
        except ValueError as e:
            log.error("%s; fix the file (the users in it are not created)", e)
            self._bootstrapped_term = term
            return
        missing = [n for n in users if n not in self._security.scram_credentials]
        if missing:
            await self.server.write(lambda img: sc.bootstrap_users(img.security, users))
            log.info("bootstrap users created: %s", ", ".join(sorted(missing)))
        self._bootstrapped_term = term
