"""`kraftlog user ...`, `kraftlog acl ...` and `kraftlog token ...`: users, ACLs and bearer
tokens kept in the metadata quorum (API.md, section Security), through any broker's
/v1/admin routes (http_api/broker/security_admin.py).

    kraftlog user create NAME --password-file F [--iterations N]   (F "-": stdin)
    kraftlog user alter NAME --password-file F [--iterations N]    (change the password)
    kraftlog user delete NAME
    kraftlog user list
    kraftlog acl add --principal User:NAME --operation OP (--topic T | --group G | --cluster
                     | --transactional-id X) [--prefixed] [--deny]
    kraftlog acl remove   (the same flags: removes exactly that ACL)
    kraftlog acl list [--principal P] [--topic T | --group G | --cluster | --transactional-id X] [--prefixed]
    kraftlog token create --principal User:NAME [--lifetime-ms N]  (prints the token once)
    kraftlog token list [--principal P]
    kraftlog token delete TOKEN_ID

They use the shared client transport (http_api/client), so the client flags of every
command (--bootstrap, --output, --ca-file, credentials) apply to them too.
"""
from __future__ import annotations

import argparse
import json
import sys

from partitions.errors import ErrorCode, KraftlogError

OPERATIONS = ("READ", "WRITE", "CREATE", "DELETE", "ALTER", "DESCRIBE", "DESCRIBE_CONFIGS", "ALTER_CONFIGS",
              "CLUSTER_ACTION", "IDEMPOTENT_WRITE", "ALL")


def _resource_flags(p: argparse.ArgumentParser, required: bool) -> None:
    g = p.add_mutually_exclusive_group(required=required)
    g.add_argument("--topic", metavar="T")
    g.add_argument("--group", metavar="G")
    g.add_argument("--transactional-id", metavar="X")
    g.add_argument("--cluster", action="store_true")
    p.add_argument("--prefixed", action="store_true", help="the name is a prefix (PREFIXED pattern)")


def add_security_parsers(sub, client_parent: argparse.ArgumentParser, run_client,
                         new_password_parent: argparse.ArgumentParser | None = None) -> None:
    """Wire `user`, `acl` and `token` into the `kraftlog` parser. `user create|alter` take
    `new_password_parent` (the client flags without --password-file, which names the new
    user's password there; the caller authenticates with $KRAFTLOG_PASSWORD or --token-file)."""
    u = sub.add_parser("user", help="SCRAM-SHA-256 users: create, alter, delete, list")
    usub = u.add_subparsers(dest="user_cmd", metavar="ACTION")
    for action in ("create", "alter"):
        p = usub.add_parser(action, parents=[new_password_parent or client_parent])
        p.add_argument("name")
        p.add_argument("--password-file", required=True, metavar="F",
                       help="file holding the password (first line; - reads stdin)")
        p.add_argument("--iterations", type=int, default=None, help="PBKDF2 rounds (4096-16384, default 4096)")
    ud = usub.add_parser("delete", parents=[client_parent])
    ud.add_argument("name")
    usub.add_parser("list", parents=[client_parent])

    a = sub.add_parser("acl", help="ACLs (Kafka's model): add, remove, list")
    asub = a.add_subparsers(dest="acl_cmd", metavar="ACTION")
    for action in ("add", "remove"):
        p = asub.add_parser(action, parents=[client_parent])
        p.add_argument("--principal", required=True, help="User:NAME or User:*")
        p.add_argument("--operation", required=True, type=str.upper, choices=OPERATIONS)
        _resource_flags(p, required=True)
        p.add_argument("--deny", action="store_true", help="a DENY ACL (deny wins over allow)")
    al = asub.add_parser("list", parents=[client_parent])
    al.add_argument("--principal")
    _resource_flags(al, required=False)

    t = sub.add_parser("token", help="bearer tokens for services: create, list, delete")
    tsub = t.add_subparsers(dest="token_cmd", metavar="ACTION")
    tc = tsub.add_parser("create", parents=[client_parent])
    tc.add_argument("--principal", required=True, help="User:NAME the token authenticates as")
    tc.add_argument("--lifetime-ms", type=int, default=None, help="expires after this long (default: never)")
    tl = tsub.add_parser("list", parents=[client_parent])
    tl.add_argument("--principal")
    td = tsub.add_parser("delete", parents=[client_parent])
    td.add_argument("token_id")

    for parser, dest, fn in ((u, "user_cmd", _user), (a, "acl_cmd", _acl), (t, "token_cmd", _token)):
        def run(args: argparse.Namespace, parser=parser, dest=dest, fn=fn) -> int:
            if not getattr(args, dest):
                parser.print_help(sys.stderr)
                return 2
            return run_client(fn, args)
        parser.set_defaults(func=run)


def read_password_file(path: str) -> str:
    """The password in `path` (its first line; "-": stdin); KraftlogError when missing or empty."""
    try:
        if path == "-":
            text = sys.stdin.readline()
        else:
            with open(path, encoding="utf-8") as f:
                text = f.readline()
    except OSError as e:
        raise KraftlogError(ErrorCode.INVALID_REQUEST, f"--password-file {path}: {e.strerror}") from None
    password = text.rstrip("\r\n")
    if not password:
        raise KraftlogError(ErrorCode.INVALID_REQUEST, f"--password-file {path} is empty; put the password on its first line")
    return password


def binding_from_args(args: argparse.Namespace) -> dict:
    if args.cluster:
        rtype, name = "CLUSTER", "kafka-cluster"
    elif args.topic is not None:
        rtype, name = "TOPIC", args.topic
    elif args.group is not None:
        rtype, name = "GROUP", args.group
    else:
        rtype, name = "TRANSACTIONAL_ID", args.transactional_id
    return {"principal": args.principal, "resource_type": rtype, "resource_name": name,
            "pattern_type": "PREFIXED" if args.prefixed else "LITERAL", "operation": args.operation,
            "permission": "DENY" if args.deny else "ALLOW"}


def format_acl(b: dict) -> str:
    """kafka-acls style: `User:alice has ALLOW permission for READ on TOPIC orders (LITERAL)`."""
    return (f"{b['principal']} has {b['permission']} permission for {b['operation']} on "
            f"{b['resource_type']} {b['resource_name']} ({b['pattern_type']})")


def _print(args: argparse.Namespace, doc, text: str) -> None:
    print(json.dumps(doc) if args.output == "json" else text)


async def _user(args: argparse.Namespace) -> int:
    from http_api.client import AdminClient

    async with AdminClient(args.bootstrap) as admin:
        t = admin.t
        if args.user_cmd in ("create", "alter"):
            body = {"password": read_password_file(args.password_file)}
            if args.iterations is not None:
                body["iterations"] = args.iterations
            if args.user_cmd == "create":
                _, doc = await t.bootstrap_json("POST", "/v1/admin/users", json_body={"name": args.name, **body})
                _print(args, doc, f"Created user {args.name} ({doc['mechanism']}, {doc['iterations']} iterations).")
            else:
                _, doc = await t.bootstrap_json("PUT", f"/v1/admin/users/{args.name}", json_body=body)
                _print(args, doc, f"Changed the password of user {args.name}.")
        elif args.user_cmd == "delete":
            await t.bootstrap_json("DELETE", f"/v1/admin/users/{args.name}")
            _print(args, {"deleted": args.name}, f"Deleted user {args.name}.")
        else:
            _, doc = await t.bootstrap_json("GET", "/v1/admin/users")
            _print(args, doc, "\n".join(f"{u['name']}\t{u['mechanism']}\t{u['iterations']}" for u in doc["users"]))
    return 0


async def _acl(args: argparse.Namespace) -> int:
    from http_api.client import AdminClient

    async with AdminClient(args.bootstrap) as admin:
        t = admin.t
        if args.acl_cmd == "add":
            _, doc = await t.bootstrap_json("POST", "/v1/admin/acls", json_body=binding_from_args(args))
            _print(args, doc, "\n".join("Added ACL: " + format_acl(b) for b in doc["acls"]))
        elif args.acl_cmd == "remove":
            _, doc = await t.bootstrap_json("POST", "/v1/admin/acls/delete", json_body=binding_from_args(args))
            _print(args, doc, "\n".join("Removed ACL: " + format_acl(b) for b in doc["deleted"]))
        else:
            params = {}
            if args.principal:
                params["principal"] = args.principal
            if args.cluster or args.topic is not None or args.group is not None or args.transactional_id is not None:
                b = binding_from_args(argparse.Namespace(**{**vars(args), "operation": "ALL", "deny": False}))
                params.update(resource_type=b["resource_type"], resource_name=b["resource_name"],
                              pattern_type=b["pattern_type"])
            _, doc = await t.bootstrap_json("GET", "/v1/admin/acls", params=params)
            _print(args, doc, "\n".join(format_acl(b) for b in doc["acls"]))
    return 0


async def _token(args: argparse.Namespace) -> int:
    from http_api.client import AdminClient

    async with AdminClient(args.bootstrap) as admin:
        t = admin.t
        if args.token_cmd == "create":
            body = {"principal": args.principal}
            if args.lifetime_ms is not None:
                body["lifetime_ms"] = args.lifetime_ms
            _, doc = await t.bootstrap_json("POST", "/v1/admin/tokens", json_body=body)
            # the token itself alone on stdout (text), so `kraftlog token create ... > F` makes a token file
            _print(args, doc, doc["token"])
            if args.output != "json":
                sys.stderr.write(f"token {doc['token_id']} for {doc['principal']}: shown once, keep it safe\n")
        elif args.token_cmd == "delete":
            await t.bootstrap_json("DELETE", f"/v1/admin/tokens/{args.token_id}")
            _print(args, {"deleted": args.token_id}, f"Deleted token {args.token_id}.")
        else:
            params = {"principal": args.principal} if args.principal else {}
            _, doc = await t.bootstrap_json("GET", "/v1/admin/tokens", params=params)
            _print(args, doc, "\n".join(f"{x['token_id']}\t{x['principal']}\texpires "
                                        f"{x['expiry_timestamp_ms'] if x['expiry_timestamp_ms'] else 'never'}"
                                        for x in doc["tokens"]))
    return 0
