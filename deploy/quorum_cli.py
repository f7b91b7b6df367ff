"""`kraftlog quorum ...`: the controller quorum (API.md section Scale-out), through any
broker's /v1/admin/quorum routes (http_api/broker/quorum_admin.py), which forward to the
active controller.

    kraftlog quorum describe [--output json]    {"leader_id", "voters": [{"id", "address", "lag", ...}]}
    kraftlog quorum add-controller --controller-url URL
        joins a controller already started (with --join) on its host: reads its identity
        (GET URL/controller/v1/quorum/identity: id, raft address, incarnation) and adds it
    kraftlog quorum remove-controller ID

One change at a time; the last voter cannot be removed; removing the active controller
hands its leadership to another voter first. For a local cluster, `kraftlog cluster
add-controller --data-dir D` starts the new controller and adds it (deploy/cluster.py).
"""
from __future__ import annotations

import argparse
import json
import sys

ADMIN_QUORUM = "/v1/admin/quorum"
CHANGE_TIMEOUT_S = 90.0


def add_quorum_parser(sub, client_parent: argparse.ArgumentParser, run_client) -> None:
    q = sub.add_parser("quorum", help="controller quorum: describe, add-controller, remove-controller")
    qsub = q.add_subparsers(dest="quorum_cmd", metavar="ACTION")
    qsub.add_parser("describe", parents=[client_parent], help="voters, leader and each voter's lag")
    a = qsub.add_parser("add-controller", parents=[client_parent],
                        help="add a controller started with --join (on its host) to the quorum")
    a.add_argument("--controller-url", required=True, metavar="URL",
                   help="the new controller's API URL (its --http-host/--http-port)")
    r = qsub.add_parser("remove-controller", parents=[client_parent], help="remove a controller voter")
    r.add_argument("id", type=int)

    def run(args: argparse.Namespace) -> int:
        if not args.quorum_cmd:
            q.print_help(sys.stderr)
            return 2
        return run_client(_quorum, args)
    q.set_defaults(func=run)


def format_describe(doc: dict) -> str:
    lines = [f"leader: {doc.get('leader_id')}"]
    if doc.get("pending_change"):
        ch = doc["pending_change"]
        lines.append(f"pending change: {'adding' if ch['op'] == 'add' else 'removing'} controller {ch['id']}")
    lines.append(f"{'id':<6}{'address':<24}{'lag':<8}{'state':<10}url")
    for v in doc["voters"]:
        lag = "-" if v.get("lag") is None else str(v["lag"])
        lines.append(f"{str(v['id']):<6}{v['address']:<24}{lag:<8}{v.get('state') or '':<10}{v.get('url') or ''}")
    return "\n".join(lines)


def _print(args: argparse.Namespace, doc: dict, text: str) -> None:
    print(json.dumps(doc) if args.output == "json" else text)


async def _quorum(args: argparse.Namespace) -> int:
    from http_api.client import AdminClient

    async with AdminClient(args.bootstrap) as admin:
        t = admin.t
        if args.quorum_cmd == "describe":
            _, doc = await t.bootstrap_json("GET", ADMIN_QUORUM)
            if args.output == "json":   # the contract's shape first
                doc = {"leader_id": doc["leader_id"], "voters": doc["voters"],
                       **{k: v for k, v in doc.items() if k not in ("leader_id", "voters")}}
            _print(args, doc, format_describe(doc))
        elif args.quorum_cmd == "add-controller":
            url = args.controller_url.rstrip("/")
            _, _, raw = await t.request("GET", url + "/controller/v1/quorum/identity")
            ident = json.loads(raw)
            body = {k: ident[k] for k in ("id", "raft_address", "url", "incarnation")}
            _, doc = await t.bootstrap_json("POST", ADMIN_QUORUM + "/voters", json_body=body,
                                            timeout_s=CHANGE_TIMEOUT_S)
            note = "" if doc.get("caught_up", True) else " (not caught up yet: it catches up while running)"
            _print(args, doc, f"Added controller {body['id']} ({body['raft_address']}) to the quorum{note}.\n"
                              + format_describe(doc))
        else:
            _, doc = await t.bootstrap_json("DELETE", f"{ADMIN_QUORUM}/voters/{args.id}", timeout_s=CHANGE_TIMEOUT_S)
            _print(args, doc, f"Removed controller {args.id} from the quorum (it stops).\n" + format_describe(doc))
    return 0


# ---------------------------------------------------------------------- kraftlog cluster add-controller
def _http_json(method: str, url: str, body: dict | None = None, timeout_s: float = 10.0, ssl_context=None,
               headers: dict | None = None) -> tuple[int, dict]:
    import urllib.error
    import urllib.request

    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s, context=ssl_context) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as e:
        try:
            return e.code, json.loads(e.read() or b"{}")
        except ValueError:
            return e.code, {}


def cluster_add_controller(args: argparse.Namespace) -> int:
    """`kraftlog cluster add-controller --data-dir D`: start controller N+1 of a local cluster
    with --join, add it to the quorum through a broker, print its URL. It is recorded in
    DATA_DIR/cluster.json (`status` lists it, `down` stops it, `up` restarts it). On a
    --secure cluster it gets a certificate from the cluster's CA and the CLI talks TLS as admin."""
    import os
    import time

    from deploy import cluster as cl
    from deploy.config import NodeConfig
    from deploy.supervisor import client_ssl_context, controller_command, port_in_use, spawn

    def fail(msg: str, code: int = 1) -> int:
        sys.stderr.write(f"kraftlog: {msg}\n")
        return code

    data_dir = os.path.abspath(args.data_dir)
    state = cl.load_state(data_dir)
    if state is None:
        return fail(f"no cluster in {data_dir} (no {cl.STATE_FILE}); check --data-dir")
    state["data_dir"] = data_dir
    tls = client_ssl_context(cl._node_config(state, 1)) if state.get("secure") else None
    auth = cl.admin_headers(state)

    def call(method: str, url: str, body: dict | None = None, timeout_s: float = 10.0) -> tuple[int, dict]:
        return _http_json(method, url, body, timeout_s, ssl_context=tls, headers=auth)

    procs = [p for p in state.get("processes", []) if cl.alive(p.get("pid"))]
    brokers = [p["url"] for p in procs if p["role"] == "broker"]
    if not brokers:
        return fail(f"the cluster in {data_dir} is not running; start it with kraftlog cluster up")
    status, quorum = call("GET", brokers[0] + ADMIN_QUORUM)
    if status != 200:
        return fail(f"quorum describe failed: {quorum.get('error_code')}: {quorum.get('message')}")
    if quorum.get("pending_change"):
        return fail(f"another quorum change is in flight ({quorum['pending_change']}); retry when it is done")
    taken = {v["id"] for v in quorum["voters"] if v["id"] is not None} | set(quorum.get("removed", []))
    taken |= {p["node_id"] for p in state.get("processes", [])} | set(range(1, state["nodes"] + 1))
    taken |= set(state.get("added_controllers", []))
    nid = max(taken) + 1
    base = state["base_port"]
    http_port, raft_port = base + cl.CONTROLLER_PORT_OFFSET + nid - 1, base + cl.RAFT_PORT_OFFSET + nid - 1
    for port in (http_port, raft_port):
        if port_in_use("127.0.0.1", port):
            return fail(f"port {port} for controller {nid} is in use; stop what uses it")
    voters = []
    for v in quorum["voters"]:
        if v.get("url") is None:
            return fail(f"voter at {v['address']} is not registered yet; retry in a few seconds")
        host, rport = v["address"].rsplit(":", 1)
        voters.append(f"{v['id']}@{host}:{rport}:{v['url'].rsplit(':', 1)[1]}")
    voters.append(f"{nid}@127.0.0.1:{raft_port}:{http_port}")
    n = state["nodes"]
    cl.ensure_node_secrets(state, nid)   # --secure: TLS on its listeners like the others
    cfg = NodeConfig.from_dict(dict(
        node_id=nid, data_dir=os.path.join(data_dir, f"node-{nid}"), http_port=base + nid - 1,
        controller_port=http_port, raft_port=raft_port, cluster_id=state["cluster_id"],
        controller_quorum_voters=",".join(voters), password=state["password"],
        default_replication_factor=min(3, n), min_insync_replicas=2 if n >= 3 else 1, log_level="INFO",
        **cl.security_settings(state, nid)),
        source="cluster add-controller")
    os.makedirs(cfg.data_dir, exist_ok=True)
    pr = spawn(controller_command(cfg) + ["--join"], {"KRAFTLOG_RAFT_PASSWORD": state["password"]},
               os.path.join(cfg.data_dir, "controller.log"), detach=True)
    state.setdefault("added_controllers", []).append(nid)
    state["processes"] = state.get("processes", []) + [
        {"node_id": nid, "role": "controller", "pid": pr.pid, "url": cfg.controller_url}]
    cl.save_state(data_dir, state)
    log_path = os.path.join(cfg.data_dir, "controller.log")
    deadline = time.monotonic() + cl.READY_TIMEOUT_S
    ident = None
    while ident is None and time.monotonic() < deadline:
        if not cl.alive(pr.pid):
            return fail(f"controller {nid} (pid {pr.pid}) exited; see {log_path}")
        try:
            # a joining controller knows no user yet: the client certificate (a broker principal) only
            status, doc = _http_json("GET", cfg.controller_url + "/controller/v1/quorum/identity", timeout_s=2.0,
                                     ssl_context=tls)
            ident = doc if status == 200 else None
        except OSError:
            pass
        if ident is None:
            time.sleep(0.2)
    if ident is None:
        return fail(f"controller {nid} did not answer within {cl.READY_TIMEOUT_S:.0f}s; see {log_path}")
    body = {k: ident[k] for k in ("id", "raft_address", "url", "incarnation")}
    status, doc = call("POST", brokers[0] + ADMIN_QUORUM + "/voters", body, timeout_s=CHANGE_TIMEOUT_S)
    if status != 200:
        return fail(f"adding controller {nid} failed: {doc.get('error_code')}: {doc.get('message')} (it keeps "
                    f"running, waiting to join: retry with kraftlog quorum add-controller --controller-url "
                    f"{cfg.controller_url}, or stop pid {pr.pid})")
    print(cfg.controller_url)
    return 0
