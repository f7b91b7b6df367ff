"""`kraftlog log-cleaner run|status`: retention and compaction on demand, on every broker.

    kraftlog log-cleaner run [--topic T] [--no-compaction] [--no-retention] [--force] [--output json]
    kraftlog log-cleaner status [--output json]

Each broker cleans its own replicas (POST /admin/v1/log-cleaner/run, see
http_api/broker/log_cleaner.py); the brokers are found through GET /v1/metadata on the
bootstrap URL. `--force` compacts every compacted log with something cleanable, whatever
its dirty ratio.
"""
from __future__ import annotations

import argparse
import json
import sys


def add_log_cleaner_parser(sub, client_parent: argparse.ArgumentParser, run_client) -> None:
    lc = sub.add_parser("log-cleaner", help="run retention/compaction now, or show the cleaner's state")
    lsub = lc.add_subparsers(dest="cleaner_cmd", metavar="ACTION")
    r = lsub.add_parser("run", parents=[client_parent])
    r.add_argument("--topic")
    r.add_argument("--no-compaction", action="store_true")
    r.add_argument("--no-retention", action="store_true")
    r.add_argument("--force", action="store_true", help="compact even below min.cleanable.dirty.ratio")
    lsub.add_parser("status", parents=[client_parent])

    def run(a: argparse.Namespace) -> int:
        if not a.cleaner_cmd:
            lc.print_help(sys.stderr)
            return 2
        return run_client(_log_cleaner, a)
    lc.set_defaults(func=run)


async def _json_or_raise(resp) -> dict:
    from partitions.errors import ErrorCode, KraftlogError

    doc = await resp.json(content_type=None)
    if resp.status >= 400:
        code = ErrorCode.from_name(doc.get("error_code") if isinstance(doc, dict) else None)
        message = doc.get("message", doc) if isinstance(doc, dict) else doc
        raise KraftlogError(code, f"{resp.url}: {message}")
    return doc


async def _log_cleaner(args: argparse.Namespace) -> int:
    import aiohttp

    bootstrap = args.bootstrap.split(",")[0].rstrip("/")
    from http_api.wire.tls import cli_client_context   # https brokers: --ca-file / $KRAFTLOG_CA_FILE

    from http_api.wire.auth import client_headers_from_env   # --user/--password-file/--token-file
    ssl_context = cli_client_context()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ssl_context or True),
                                     headers=client_headers_from_env()) as s:
        async with s.get(f"{bootstrap}/v1/metadata") as resp:
            brokers = [b for b in (await _json_or_raise(resp))["brokers"] if not b.get("fenced")]
        out = {}
        for b in brokers:
            url = b["url"].rstrip("/")
            if args.cleaner_cmd == "run":
                body = {"compaction": not args.no_compaction, "retention": not args.no_retention,
                        "force": args.force}
                if args.topic:
                    body["topic"] = args.topic
                async with s.post(f"{url}/admin/v1/log-cleaner/run", json=body) as resp:
                    out[b["id"]] = await _json_or_raise(resp)
            else:
                async with s.get(f"{url}/admin/v1/log-cleaner") as resp:
                    out[b["id"]] = await _json_or_raise(resp)
    if args.output == "json":
        print(json.dumps({"brokers": {str(k): v for k, v in out.items()}}))
        return 0
    for broker_id, d in out.items():
        if args.cleaner_cmd == "run":
            for c in d.get("cleaned", []):
                print(f"broker {broker_id}\t{c['topic']}-{c['partition']}\tcleaned [{c['first_dirty_offset']}, "
                      f"{c['end_offset']})\t{c['bytes_read']} -> {c['bytes_written']} bytes\t"
                      f"{c['tombstones_removed']} tombstones removed\t{c['elapsed_s']:.3f} s"
                      + ("\taborted" if c["aborted"] else ""))
            ret = d.get("retention")
            if ret is not None:
                print(f"broker {broker_id}\tretention deleted {ret['segments_deleted']} segment(s)")
        else:
            print(f"broker {broker_id}\tpasses {d['passes_total']}\tcleaned {d['bytes_read_total']} -> "
                  f"{d['bytes_written_total']} bytes\tretention deleted {d['segments_deleted_by_retention_total']} "
                  f"segment(s)")
            for r in d["dirty_ratio"]:
                print(f"broker {broker_id}\t{r['topic']}-{r['partition']}\tdirty ratio {r['dirty_ratio']:.2f}")
    return 0
