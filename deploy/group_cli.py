"""`kraftlog group list` and `kraftlog group describe G` (consumer groups, with lag).

    kraftlog group list [--output json]
    kraftlog group describe G [--output json]
    kraftlog group delete G            (an empty group: its committed offsets are forgotten)

Text output follows kafka-consumer-groups.sh: one line per partition with the committed
offset, the high watermark (what a consumer can read up to), the lag and the owning member.
"""
from __future__ import annotations

import argparse
import json
import sys


def add_group_parser(sub, client_parent: argparse.ArgumentParser, run_client) -> None:
    g = sub.add_parser("group", help="consumer groups: list, describe (with lag)")
    gsub = g.add_subparsers(dest="group_cmd", metavar="ACTION")
    gsub.add_parser("list", parents=[client_parent])
    gd = gsub.add_parser("describe", parents=[client_parent])
    gd.add_argument("group")
    gdel = gsub.add_parser("delete", parents=[client_parent], help="forget an empty group and its offsets")
    gdel.add_argument("group")

    def run(a: argparse.Namespace) -> int:
        if not a.group_cmd:
            g.print_help(sys.stderr)
            return 2
        return run_client(_group, a)
    g.set_defaults(func=run)


def _dash(v) -> str:
    return "-" if v is None else str(v)


def format_describe(d: dict) -> str:
    lines = [f"Group: {d['group_id']}\tState: {d['state']}\tAssignor: {d['assignor']}\t"
             f"Epoch: {d['group_epoch']}\tCoordinator: {d.get('coordinator_id')}\t"
             f"Members: {len(d['members'])}\tTotal lag: {d.get('total_lag', 0)}"]
    clients = {m["member_id"]: m.get("client_id", "") for m in d["members"]}
    rows = [("TOPIC", "PARTITION", "CURRENT-OFFSET", "HIGH-WATERMARK", "LAG", "MEMBER-ID", "CLIENT-ID")]
    for p in d["partitions"]:
        rows.append((p["topic"], str(p["partition"]), _dash(p["committed_offset"]), _dash(p["high_watermark"]),
                     _dash(p["lag"]), _dash(p["member_id"]), clients.get(p["member_id"], "") or "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    return "\n".join(lines)


async def _group(args: argparse.Namespace) -> int:
    from http_api.client import AdminClient

    async with AdminClient(args.bootstrap) as admin:
        if args.group_cmd == "list":
            groups = await admin.list_groups()
            if args.output == "json":
                print(json.dumps({"groups": groups}))
            else:
                for g in groups:
                    print(f"{g['group_id']}\t{g['state']}\t{g['members']} member(s)")
        elif args.group_cmd == "delete":
            await admin.delete_group(args.group)
            print(json.dumps({"deleted": args.group}) if args.output == "json" else f"Deleted group {args.group}.")
        else:
            d = await admin.describe_group(args.group)
            print(json.dumps(d) if args.output == "json" else format_describe(d))
    return 0
