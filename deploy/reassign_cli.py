"""`kraftlog reassign ...` and `kraftlog broker ...`: partition moves (Kafka's KIP-455) and
broker decommission, through any broker's /v1/reassignments and /v1/brokers routes
(http_api/broker/reassignments.py; API.md, section Scale-out).

    kraftlog reassign execute FILE|- [--throttle BYTES_PER_S]   Kafka's reassignment JSON
    kraftlog reassign status [--wait] [--output json]           running moves, bytes moved and remaining
    kraftlog reassign cancel                                    the original replicas come back
    kraftlog reassign plan ...                                  deploy/reassign_planner_cli.py
    kraftlog broker decommission ID [--wait]                    cordon, move every replica away, unregister
    kraftlog broker recommission ID                             cancel a decommission
    kraftlog broker list                                        brokers and their state

They use the shared client transport (http_api/client), so the client flags of every
command (--bootstrap, --output, --ca-file, credentials) apply to them too.
"""
from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.util
import json
import sys
import time

from partitions.errors import ErrorCode, KraftlogError

WAIT_POLL_S = 0.5
PLANNER_CLI = "deploy.reassign_planner_cli"


def add_reassign_parsers(sub, client_parent: argparse.ArgumentParser, run_client) -> None:
    """Wire `reassign` (execute, status, cancel, and `plan` when deploy.reassign_planner_cli
    is there: its `add_plan_parser(rsub)`) and `broker` into the `kraftlog` parser."""
    r = sub.add_parser("reassign", help="partition moves (Kafka's reassignment JSON): plan, execute, status, cancel")
    rsub = r.add_subparsers(dest="reassign_cmd", metavar="ACTION")
    ex = rsub.add_parser("execute", parents=[client_parent], help="start the moves of a reassignment JSON file")
    ex.add_argument("file", help='{"version": 1, "partitions": [{"topic", "partition", "replicas"}]} ("-": stdin)')
    ex.add_argument("--throttle", type=int, default=None, metavar="BYTES_PER_S",
                    help="replication throttle of the copies while the moves run (removed when they end)")
    st = rsub.add_parser("status", parents=[client_parent], help="running moves and the bytes they still copy")
    st.add_argument("--wait", action="store_true", help="wait until no move runs")
    rsub.add_parser("cancel", parents=[client_parent], help="cancel every running move")
    if importlib.util.find_spec(PLANNER_CLI) is not None:   # kraftlog reassign plan, when that module is there
        # looked up by name: the planner's module imports deploy.cli (its client parent), which imports this one
        importlib.import_module(PLANNER_CLI).add_plan_parser(rsub)

    def run_reassign(args: argparse.Namespace) -> int:
        if not args.reassign_cmd:
            r.print_help(sys.stderr)
            return 2
        return run_client(_reassign, args)
    r.set_defaults(func=run_reassign)

    b = sub.add_parser("broker", help="broker membership: decommission, recommission, list")
    bsub = b.add_subparsers(dest="broker_cmd", metavar="ACTION")
    d = bsub.add_parser("decommission", parents=[client_parent],
                        help="cordon the broker, move every replica away, then unregister it")
    d.add_argument("broker_id", type=int, metavar="ID")
    d.add_argument("--wait", action="store_true", help="wait until it holds no replica and is decommissioned")
    rc = bsub.add_parser("recommission", parents=[client_parent], help="cancel a decommission")
    rc.add_argument("broker_id", type=int, metavar="ID")
    bsub.add_parser("list", parents=[client_parent], help="brokers with their state")

    def run_broker(args: argparse.Namespace) -> int:
        if not args.broker_cmd:
            b.print_help(sys.stderr)
            return 2
        return run_client(_broker, args)
    b.set_defaults(func=run_broker)


def read_reassignment(path: str, throttle: int | None) -> dict:
    """The reassignment JSON in `path` ("-": stdin), with the throttle added."""
    try:
        text = sys.stdin.read() if path == "-" else open(path, encoding="utf-8").read()
    except OSError as e:
        raise KraftlogError(ErrorCode.INVALID_REQUEST, f"{path}: {e.strerror}") from None
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise KraftlogError(ErrorCode.INVALID_REQUEST, f"{path} is not JSON ({e}); `kraftlog reassign plan` "
                            "prints the expected shape") from None
    if not isinstance(doc, dict):
        raise KraftlogError(ErrorCode.INVALID_REQUEST, f'{path}: expected {{"version": 1, "partitions": [...]}}')
    if throttle is not None:
        doc["throttle"] = throttle
    return doc


def format_reassignments(doc: dict) -> str:
    rows = doc.get("reassignments", [])
    if not rows:
        return "No reassignment is running."
    lines = []
    for m in rows:
        remaining, moved = m.get("bytes_remaining"), m.get("bytes_moved")
        left = "?" if remaining is None else f"{remaining} bytes"
        done = "?" if moved is None else f"{moved} bytes"
        lines.append(f"{m['topic']}-{m['partition']}\treplicas {m['replicas']}\tadding {m['adding_replicas']}"
                     f"\tremoving {m['removing_replicas']}\tmoved {done}\tremaining {left}")
    return "\n".join(lines)


def _print(args: argparse.Namespace, doc, text: str) -> None:
    print(json.dumps(doc) if args.output == "json" else text)


async def _reassign(args: argparse.Namespace) -> int:
    from http_api.client import AdminClient

    async with AdminClient(args.bootstrap) as admin:
        t = admin.t
        if args.reassign_cmd == "execute":
            body = read_reassignment(args.file, args.throttle)
            _, doc = await t.bootstrap_json("POST", "/v1/reassignments", json_body=body)
            n = len(doc.get("reassignments", []))
            _print(args, doc, f"Started the reassignment of {len(body.get('partitions', []))} partition(s); "
                              f"{n} move(s) running. Follow it with: kraftlog reassign status --wait")
        elif args.reassign_cmd == "cancel":
            _, doc = await t.bootstrap_json("DELETE", "/v1/reassignments")
            _print(args, doc, f"Cancelled {len(doc.get('cancelled', []))} move(s).")
        else:
            while True:
                _, doc = await t.bootstrap_json("GET", "/v1/reassignments")
                if not args.wait or not doc.get("reassignments"):
                    break
                if args.output != "json":
                    sys.stderr.write(format_reassignments(doc) + "\n")
                await asyncio.sleep(WAIT_POLL_S)
            _print(args, doc, format_reassignments(doc))
    return 0


async def _broker(args: argparse.Namespace) -> int:
    from http_api.client import AdminClient

    async with AdminClient(args.bootstrap) as admin:
        t = admin.t
        if args.broker_cmd == "list":
            _, doc = await t.bootstrap_json("GET", "/v1/brokers")
            _print(args, doc, "\n".join(f"{b['id']}\t{b['url']}\track={b['rack']}\tfenced={b['fenced']}\t{b['state']}"
                                        for b in doc["brokers"]))
            return 0
        action = args.broker_cmd
        _, doc = await t.bootstrap_json("POST", f"/v1/brokers/{args.broker_id}/{action}")
        started = time.monotonic()
        while action == "decommission" and args.wait and doc.get("state") != "decommissioned":
            await asyncio.sleep(WAIT_POLL_S)
            _, brokers = await t.bootstrap_json("GET", "/v1/brokers")
            entry = next((b for b in brokers["brokers"] if b["id"] == args.broker_id), {})
            doc = dict(doc, **entry)
            if args.output != "json":
                sys.stderr.write(f"broker {args.broker_id}: {doc.get('state')} "
                                 f"({time.monotonic() - started:.0f} s)\n")
        state = doc.get("state", "?")
        _print(args, doc, f"Broker {args.broker_id} is {state}"
                          + (f" ({doc['replicas']} replica(s) left to move)." if "replicas" in doc and
                             state == "draining" else "."))
    return 0
