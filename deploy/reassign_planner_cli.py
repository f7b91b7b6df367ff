"""`kraftlog reassign plan (--add-brokers IDS | --remove-brokers IDS | --rebalance) [--topics T,...]`:
print Kafka's reassignment JSON proposed by metadata_quorum/reassignment_planner.py for the
cluster as the brokers describe it (`GET /v1/metadata`, `GET /v1/brokers` when served: racks,
draining or decommissioned brokers). Operators may edit the JSON, then
`kraftlog reassign execute FILE`.

`add_plan_parser(reassign_subparsers)` adds the `plan` action to the `reassign` command.
"""
from __future__ import annotations

import argparse
import json
import sys


def _ids(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give broker ids separated by commas, e.g. 4,5") from None
    if not out:
        raise argparse.ArgumentTypeError("give at least one broker id, e.g. 4")
    return out


def _capacity(text: str) -> tuple[int, int]:
    bid, sep, cap = text.partition("=")
    try:
        if not sep:
            raise ValueError
        return int(bid), int(cap)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give ID=BYTES, e.g. --capacity 4=100000000000") from None


def add_plan_parser(reassign_subparsers) -> argparse.ArgumentParser:
    """`reassign plan` under the `reassign` command's subparsers."""
    from deploy.cli import _client_parent, _run_client
    p = reassign_subparsers.add_parser(
        "plan", parents=[_client_parent()],
        help="propose moves (Kafka's reassignment JSON) for added brokers, removed brokers or a rebalance")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--add-brokers", type=_ids, metavar="IDS", help="new brokers to fill, e.g. 4,5")
    mode.add_argument("--remove-brokers", type=_ids, metavar="IDS", help="brokers to empty, e.g. 2")
    mode.add_argument("--rebalance", action="store_true", help="even out replicas, bytes and leaders")
    p.add_argument("--topics", default=None, metavar="T,...", help="only move partitions of these topics")
    p.add_argument("--capacity", type=_capacity, action="append", metavar="ID=BYTES",
                   help="a broker's disk capacity: no plan puts more bytes on it (repeatable)")
    p.add_argument("--sizes", default=None, metavar="FILE",
                   help='partition sizes in bytes, JSON {"topic": {"partition": bytes}} (default: all equal)')
    p.set_defaults(func=lambda a: _run_client(_plan, a))
    return p


async def fetch_cluster(bootstrap: str) -> tuple[dict, dict]:
    """(`/v1/metadata`, brokers document): `/v1/brokers` when the broker serves it, else the
    metadata's brokers."""
    from http_api.client.transport import Transport
    from partitions.errors import ErrorCode, KraftlogError
    t = Transport(bootstrap, client_id=None, request_timeout_ms=30_000)
    try:
        _, md = await t.bootstrap_json("GET", "/v1/metadata")
        try:
            _, brokers = await t.bootstrap_json("GET", "/v1/brokers")
        except KraftlogError as e:
            if e.code not in (ErrorCode.UNKNOWN_SERVER_ERROR, ErrorCode.RESOURCE_NOT_FOUND, ErrorCode.INVALID_REQUEST):
                raise
            brokers = {"brokers": md.get("brokers", [])}
    finally:
        await t.close()
    return md, brokers


def _read_sizes(path: str | None) -> dict | None:
    if not path:
        return None
    with (sys.stdin if path == "-" else open(path)) as f:
        doc = json.load(f)
    return {(t, int(p)): int(n) for t, parts in doc.items() for p, n in parts.items()}


async def _plan(args: argparse.Namespace) -> int:
    from metadata_quorum.reassignment_planner import (assignment_from_metadata, brokers_from_metadata,
                                                      plan_reassignment)
    md, brokers_doc = await fetch_cluster(args.bootstrap)
    assignment = assignment_from_metadata(md)
    brokers = brokers_from_metadata(brokers_doc, dict(args.capacity or []))
    if args.add_brokers:
        mode, ids = "add-brokers", args.add_brokers
    elif args.remove_brokers:
        mode, ids = "remove-brokers", args.remove_brokers
    else:
        mode, ids = "rebalance", []
    topics = [t.strip() for t in args.topics.split(",") if t.strip()] if args.topics else None
    doc = plan_reassignment(assignment, brokers, mode=mode, broker_ids=ids, topics=topics,
                            sizes=_read_sizes(args.sizes))
    sys.stdout.write(json.dumps(doc, indent=None if args.output == "json" else 2) + "\n")
    if not doc["partitions"]:
        sys.stderr.write("kraftlog: nothing to move: the cluster already meets the goals\n")
    return 0
