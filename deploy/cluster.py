"""`kraftlog cluster up|down|status`: a local N-node cluster of background processes.

Layout under --data-dir DIR:
    DIR/cluster.json         nodes, ports, cluster id, raft password, process ids, secure
    DIR/node-<i>/            node i's data (controller-<i>/, broker-<i>/) and logs
                             (controller.log, broker.log)
  with --secure (deploy/certs.py):
    DIR/ca.pem, ca-key.pem   the cluster's CA (clients: --ca-file DIR/ca.pem)
    DIR/node-<i>/tls/        node i's certificate (CN broker-<i>: mTLS principal User:broker-<i>)
    DIR/admin.password       the super user admin's password (random, 0600)
    DIR/bootstrap-users.json admin's SCRAM credential (no password), which the active
                             controller writes into the metadata when admin is missing

With --tiered-storage: DIR/seaweedfs/ (a SeaweedFS S3 store, deploy/seaweedfs.py, ports
base_port + 3000 .. + 3007, S3 on base_port + 3000) and every broker's [remote_storage]
pointing at it (bucket `kraftlog`); it sticks like --secure, and `down` stops the store.

`--secure` serves every listener (brokers, controllers) over TLS, client certificates
requested (brokers present theirs to each other and to the controllers), authentication
basic + mtls, the ACL authorizer, super users admin and every broker. It sticks: `up`
again on the same data dir stays secure.

Ports for node i (1-based): broker HTTP base_port + i - 1 (API.md); controller HTTP
base_port + 1000 + i - 1; raft base_port + 2000 + i - 1; Kafka listener kafka_base_port + i - 1
(`--kafka-base-port`, default 9092; `status --output json` shows it as "kafka_address" of
each broker). `up` on an existing data dir
restarts the same cluster (same ids, ports, password) with its data; if it is already
running it just prints the broker URLs.

`add-broker` starts one more broker only (no controller) with the next node id k, on the
same port scheme (HTTP base_port + k - 1, Kafka kafka_base_port + k - 1), data under
DIR/node-<k>/; cluster.json remembers it (`"added_brokers"`), so `up` restarts it and
`down` stops it. It holds no replica until partitions are placed or reassigned onto it.
`cluster add-controller` (deploy/quorum_cli.py) likewise records `"added_controllers"`:
`up` restarts them, with every controller the cluster has had in `--voters` (a restarted
controller's raft journal replays the membership changes). `down` records the controllers
the quorum has removed (`"removed_controllers"`, from the brokers' /v1/admin/quorum) and
`up` no longer starts them. On a --secure cluster an added node gets its certificate from
the cluster's CA (CN broker-<k>: a broker principal) like the first ones.
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import secrets
import signal
import sys
import time

from deploy.config import NodeConfig
from deploy.supervisor import (broker_command, broker_env, client_ssl_context, controller_command, http_ok,
                               port_in_use, spawn)

STATE_FILE = "cluster.json"
CONTROLLER_PORT_OFFSET = 1000
RAFT_PORT_OFFSET = 2000
DEFAULT_KAFKA_BASE_PORT = 9092   # broker i's Kafka listener: kafka_base_port + i - 1 (API.md)
READY_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0
KILL_WAIT_S = 30.0   # after SIGKILL (a process in uninterruptible disk I/O exits only when that ends)
ADMIN_USER = "admin"
ADMIN_PASSWORD_FILE = "admin.password"
BOOTSTRAP_USERS_FILE = "bootstrap-users.json"


def _state_path(data_dir: str) -> str:
    return os.path.join(data_dir, STATE_FILE)


def load_state(data_dir: str) -> dict | None:
    path = _state_path(data_dir)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def save_state(data_dir: str, state: dict) -> None:
    path = _state_path(data_dir)
    tmp = path + ".tmp"
    # owner-only: the state holds the raft password
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        json.dump(state, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of ours is not alive
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def admin_headers(state: dict) -> dict:
    """The super user admin's HTTP Basic header on a --secure cluster (none otherwise)."""
    if not state.get("secure"):
        return {}
    with open(os.path.join(state["data_dir"], ADMIN_PASSWORD_FILE)) as f:
        token = base64.b64encode(f"{ADMIN_USER}:{f.read().strip()}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def ensure_node_secrets(state: dict, node_id: int) -> None:
    """Node `node_id`'s certificate (CN broker-<id>) from the cluster's CA on a --secure cluster."""
    if state.get("secure"):
        from deploy.certs import CertificateAuthority, ensure_node_certificate
        ca = CertificateAuthority.load_or_create(state["data_dir"])
        ensure_node_certificate(ca, os.path.join(state["data_dir"], f"node-{node_id}"), f"broker-{node_id}")


def security_settings(state: dict, node_id: int) -> dict:
    """The [security] settings of node `node_id` of a --secure cluster (none otherwise)."""
    if not state.get("secure"):
        return {}
    from deploy.certs import node_certificate_paths
    data_dir = state["data_dir"]
    cert, key = node_certificate_paths(os.path.join(data_dir, f"node-{node_id}"))
    return dict(tls_cert_file=cert, tls_key_file=key, tls_ca_file=os.path.join(data_dir, "ca.pem"),
                tls_client_auth="requested", authentication=["basic", "mtls"], authorizer="acl",
                bootstrap_users_file=os.path.join(data_dir, BOOTSTRAP_USERS_FILE),
                super_users=[f"User:{ADMIN_USER}"] + [f"User:broker-{i}" for i in range(1, state["nodes"] + 1)])


def make_secrets(state: dict) -> None:
    """CA, node certificates and the admin password of a --secure cluster (kept when present)."""
    from deploy.certs import CertificateAuthority, ensure_node_certificate
    data_dir = state["data_dir"]
    ca = CertificateAuthority.load_or_create(data_dir)
    for i in range(1, state["nodes"] + 1):
        ensure_node_certificate(ca, os.path.join(data_dir, f"node-{i}"), f"broker-{i}")
    path = os.path.join(data_dir, ADMIN_PASSWORD_FILE)
    if not os.path.exists(path):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(24) + "\n")
    users = os.path.join(data_dir, BOOTSTRAP_USERS_FILE)
    if not os.path.exists(users):   # a salted verifier only: the password stays in admin.password
        from metadata_quorum.security.scram import make_credential
        with open(path) as f:
            credential = make_credential(f.read().strip()).to_dict()
        fd = os.open(users + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({ADMIN_USER: credential}, f)
        os.replace(users + ".tmp", users)


def node_configs(state: dict) -> list[NodeConfig]:
    """The N nodes of `cluster up` (controller + broker each)."""
    return [_node_config(state, i) for i in range(1, state["nodes"] + 1)]


def added_broker_configs(state: dict) -> list[NodeConfig]:
    """The brokers `add-broker` started (broker only: their controller settings are unused)."""
    return [_node_config(state, i) for i in state.get("added_brokers", [])]


def controller_ids(state: dict) -> list[int]:
    """Every controller the cluster has had: nodes 1..N, then those `cluster add-controller`
    added (removed ones included: their removal is in the raft log the others replay)."""
    return list(range(1, state["nodes"] + 1)) + [i for i in state.get("added_controllers", [])
                                                 if i > state["nodes"]]


def started_controller_ids(state: dict) -> list[int]:
    """The controllers `up` starts: every controller the quorum has not removed."""
    removed = set(state.get("removed_controllers", []))
    return [i for i in controller_ids(state) if i not in removed]


def _node_config(state: dict, i: int) -> NodeConfig:
    n, base = state["nodes"], state["base_port"]
    kafka_base = state.get("kafka_base_port", DEFAULT_KAFKA_BASE_PORT)
    voters = ",".join(f"{v}@127.0.0.1:{base + RAFT_PORT_OFFSET + v - 1}:{base + CONTROLLER_PORT_OFFSET + v - 1}"
                      for v in controller_ids(state))
    return NodeConfig.from_dict(dict(
        node_id=i, data_dir=os.path.join(state["data_dir"], f"node-{i}"), http_port=base + i - 1,
        controller_port=base + CONTROLLER_PORT_OFFSET + i - 1, raft_port=base + RAFT_PORT_OFFSET + i - 1,
        kafka_port=kafka_base + i - 1,
        cluster_id=state["cluster_id"], controller_quorum_voters=voters, password=state["password"],
        # replicated by default: topics created without a replication factor get min(3, N)
        # replicas, and acks=all needs two of them in sync once there are 3 or more
        default_replication_factor=min(3, n), min_insync_replicas=2 if n >= 3 else 1,
        log_level="INFO", **security_settings(state, i), **tiered_storage_settings(state)),
        source="cluster up")


TIERED_STORAGE_PORT_OFFSET = 3000   # SeaweedFS: base_port + 3000 .. + 3007 (S3 first)
TIERED_STORAGE_BUCKET = "kraftlog"


def tiered_storage_settings(state: dict) -> dict:
    """The [remote_storage] settings of a --tiered-storage cluster (none otherwise)."""
    ts = state.get("tiered_storage")
    if not ts:
        return {}
    from deploy.seaweedfs import ACCESS_KEY_ID, SECRET_ACCESS_KEY
    return dict(remote_storage_enable=True, remote_storage_s3_endpoint=f"http://127.0.0.1:{ts['ports']['s3']}",
                remote_storage_s3_bucket=TIERED_STORAGE_BUCKET, remote_storage_s3_region="us-east-1",
                remote_storage_s3_access_key_id=ACCESS_KEY_ID, remote_storage_s3_secret_access_key=SECRET_ACCESS_KEY)


def start_object_store(state: dict) -> str | None:
    """Start the cluster's SeaweedFS (--tiered-storage) unless it runs; an error text or None."""
    ts = state.get("tiered_storage")
    if not ts or alive(ts.get("pid")):
        return None
    from deploy.seaweedfs import SeaweedFS, SeaweedPorts
    ports = SeaweedPorts(**ts["ports"])
    for name, port in ts["ports"].items():
        if port_in_use("127.0.0.1", port):
            return f"port {port} for the object store ({name}) is in use; stop what uses it or pick another --base-port"
    store = SeaweedFS(os.path.join(state["data_dir"], "seaweedfs"), ports)
    try:
        store.start()
    except RuntimeError as e:
        return str(e)
    ts["pid"] = store.pid
    return None


def stop_object_store(state: dict) -> None:
    ts = state.get("tiered_storage")
    if not ts or not alive(ts.get("pid")):
        return
    from deploy.seaweedfs import SeaweedFS, SeaweedPorts
    store = SeaweedFS(os.path.join(state["data_dir"], "seaweedfs"), SeaweedPorts(**ts["ports"]))
    store.pid = ts["pid"]
    store.stop()
    ts["pid"] = None


def up(args: argparse.Namespace) -> int:
    data_dir = os.path.abspath(args.data_dir)
    os.makedirs(data_dir, exist_ok=True)
    state = load_state(data_dir)
    if state is not None and (state["nodes"] != args.nodes or state["base_port"] != args.base_port):
        sys.stderr.write(f"kraftlog: {data_dir} holds a {state['nodes']}-node cluster on base port "
                         f"{state['base_port']}; run `kraftlog cluster up --nodes {state['nodes']} --data-dir "
                         f"{args.data_dir} --base-port {state['base_port']}` or use another --data-dir\n")
        return 2
    if state is None:
        state = {"nodes": args.nodes, "base_port": args.base_port, "data_dir": data_dir,
                 "cluster_id": f"kraftlog-{secrets.token_hex(4)}", "password": secrets.token_hex(16),
                 "processes": []}
    state["data_dir"] = data_dir
    state["kafka_base_port"] = getattr(args, "kafka_base_port", None) or state.get("kafka_base_port",
                                                                                     DEFAULT_KAFKA_BASE_PORT)
    if getattr(args, "secure", False) and not state.get("secure"):
        state["secure"] = True
    if state.get("secure"):
        make_secrets(state)
    if getattr(args, "tiered_storage", False) and not state.get("tiered_storage"):
        from deploy.seaweedfs import PORT_NAMES
        base = state["base_port"] + TIERED_STORAGE_PORT_OFFSET
        state["tiered_storage"] = {"ports": {n: base + k for k, n in enumerate(PORT_NAMES)}, "pid": None}
    err = start_object_store(state)   # before the brokers: they copy segments to it
    if err is not None:
        sys.stderr.write(f"kraftlog: {err}\n")
        return 1
    save_state(data_dir, state)
    running = {(p["node_id"], p["role"]): p for p in state.get("processes", []) if alive(p.get("pid"))}
    cfgs = node_configs(state)
    added = added_broker_configs(state)   # `add-broker`: brokers only
    controllers = [_node_config(state, i) for i in started_controller_ids(state)]
    for i in [c.node_id for c in added + controllers]:
        ensure_node_secrets(state, i)
    broker_ids, controller_ids_ = {c.node_id for c in cfgs + added}, {c.node_id for c in controllers}
    for cfg in cfgs + added + [c for c in controllers if c.node_id not in broker_ids]:
        ports = [("broker", cfg.http_port)] if cfg.node_id in broker_ids else []
        if cfg.node_id in controller_ids_:
            ports += [("controller", cfg.controller_port), ("controller", cfg.raft_port)]
        for role, port in ports:
            if (cfg.node_id, role) not in running and port_in_use("127.0.0.1", port):
                sys.stderr.write(f"kraftlog: port {port} for node {cfg.node_id}'s {role} is in use; stop what "
                                 "uses it or pick another --base-port\n")
                return 1
    procs = []
    env = {"KRAFTLOG_RAFT_PASSWORD": state["password"]}
    for cfg in controllers:
        os.makedirs(cfg.data_dir, exist_ok=True)
        p = running.get((cfg.node_id, "controller"))
        if p is None:
            pr = spawn(controller_command(cfg), env, os.path.join(cfg.data_dir, "controller.log"), detach=True)
            p = {"node_id": cfg.node_id, "role": "controller", "pid": pr.pid, "url": cfg.controller_url}
        procs.append(p)
    for cfg in cfgs + added:
        os.makedirs(cfg.data_dir, exist_ok=True)
        procs.append(running.get((cfg.node_id, "broker")) or _spawn_broker(cfg, env))
        procs[-1]["kafka_address"] = f"{cfg.listeners.kafka_host_advertised}:{cfg.listeners.kafka_port}"
    state["processes"] = procs
    save_state(data_dir, state)
    deadline = time.monotonic() + READY_TIMEOUT_S
    cfgs = cfgs + added
    pending = [c for c in cfgs]
    tls_ctx = client_ssl_context(cfgs[0])
    admin_ready = False
    admin = admin_headers(state)
    while pending and time.monotonic() < deadline:
        for p in procs:
            if not alive(p["pid"]):
                sys.stderr.write(f"kraftlog: node {p['node_id']}'s {p['role']} (pid {p['pid']}) exited; see "
                                 f"{os.path.join(data_dir, 'node-%d' % p['node_id'], p['role'] + '.log')}\n")
                return 1
        pending = [c for c in pending if not http_ok(c.broker_url + "/healthz", ssl_context=tls_ctx)]
        if not pending and state.get("secure") and not admin_ready:
            # ready for the user = the super user admin authenticates on every broker (the active
            # controller creates it from the bootstrap file; brokers learn it from the metadata)
            pending = [c for c in cfgs if not http_ok(c.broker_url + "/v1/topics", ssl_context=tls_ctx,
                                                     headers=admin)]
            admin_ready = not pending
        if pending:
            time.sleep(0.2)
    if pending:
        sys.stderr.write(f"kraftlog: brokers {[c.node_id for c in pending]} not ready within "
                         f"{READY_TIMEOUT_S:.0f}s; see the logs under {data_dir}/node-*/\n")
        return 1
    for cfg in cfgs:
        print(cfg.broker_url)
    if state.get("tiered_storage"):
        sys.stderr.write(f"kraftlog: tiered storage on: S3 (SeaweedFS) at "
                         f"{tiered_storage_settings(state)['remote_storage_s3_endpoint']}, bucket "
                         f"{TIERED_STORAGE_BUCKET}; create topics with remote.storage.enable=true\n")
    if state.get("secure"):
        sys.stderr.write(f"kraftlog: TLS on every listener; clients: --ca-file {os.path.join(data_dir, 'ca.pem')} "
                         f"--user {ADMIN_USER} --password-file {os.path.join(data_dir, ADMIN_PASSWORD_FILE)}\n")
    sys.stdout.flush()
    return 0


def _spawn_broker(cfg: NodeConfig, env: dict) -> dict:
    pr = spawn(broker_command(cfg), broker_env(cfg, env), os.path.join(cfg.data_dir, "broker.log"),
               detach=True)   # secure: no raft secret for brokers
    return {"node_id": cfg.node_id, "role": "broker", "pid": pr.pid, "url": cfg.broker_url}


def _broker_registered(urls: list[str], broker_id: int, tls_ctx) -> bool:
    """Some broker's /v1/metadata lists `broker_id` unfenced."""
    import urllib.request
    for url in urls:
        try:
            with urllib.request.urlopen(url + "/v1/metadata", timeout=5, context=tls_ctx) as r:
                doc = json.loads(r.read())
        except (OSError, ValueError):
            continue
        return any(int(b["id"]) == broker_id and not b.get("fenced") for b in doc.get("brokers", []))
    return False


def next_node_id(state: dict) -> int:
    """A node id nobody in the cluster has: not a node of `up`, an added broker, a controller
    added at run time (cluster add-controller) nor any recorded process."""
    return max([state["nodes"], *state.get("added_brokers", []), *state.get("added_controllers", []),
                *(q["node_id"] for q in state.get("processes", []))]) + 1


def add_broker(args: argparse.Namespace) -> int:
    """Start one more broker (the next node id, broker only), wait until the controller has
    registered it unfenced, print its URL; cluster.json remembers it for up/down/status."""
    data_dir = os.path.abspath(args.data_dir)
    state = load_state(data_dir)
    if state is None:
        sys.stderr.write(f"kraftlog: no cluster in {data_dir} (no {STATE_FILE}); start one with "
                         f"`kraftlog cluster up --nodes N --data-dir {args.data_dir}` first\n")
        return 1
    running = [p for p in state.get("processes", []) if alive(p.get("pid"))]
    if not any(p["role"] == "controller" for p in running):
        sys.stderr.write(f"kraftlog: the cluster in {data_dir} is stopped; run `kraftlog cluster up --nodes "
                         f"{state['nodes']} --data-dir {args.data_dir} --base-port {state['base_port']}` first\n")
        return 1
    added = list(state.get("added_brokers", []))
    node_id = next_node_id(state)
    state["data_dir"] = data_dir
    ensure_node_secrets(state, node_id)   # --secure: its certificate makes it User:broker-<id>
    cfg = _node_config(state, node_id)
    for what, port in (("HTTP", cfg.http_port), ("Kafka", cfg.listeners.kafka_port)):
        if port_in_use("127.0.0.1", port):
            sys.stderr.write(f"kraftlog: port {port} for broker {node_id}'s {what} listener is in use; stop "
                             "what uses it\n")
            return 1
    os.makedirs(cfg.data_dir, exist_ok=True)
    p = _spawn_broker(cfg, {"KRAFTLOG_RAFT_PASSWORD": state["password"]})
    p["kafka_address"] = f"{cfg.listeners.kafka_host_advertised}:{cfg.listeners.kafka_port}"
    state["added_brokers"] = added + [node_id]
    state["processes"] = state.get("processes", []) + [p]
    save_state(data_dir, state)
    tls_ctx = client_ssl_context(cfg)
    urls = [cfg.broker_url] + [q["url"] for q in running if q["role"] == "broker"]
    deadline = time.monotonic() + READY_TIMEOUT_S
    log = os.path.join(cfg.data_dir, "broker.log")
    while time.monotonic() < deadline:
        if not alive(p["pid"]):
            sys.stderr.write(f"kraftlog: broker {node_id} (pid {p['pid']}) exited; see {log}\n")
            return 1
        if http_ok(cfg.broker_url + "/healthz", ssl_context=tls_ctx) and _broker_registered(urls, node_id, tls_ctx):
            print(cfg.broker_url)
            sys.stdout.flush()
            return 0
        time.sleep(0.2)
    sys.stderr.write(f"kraftlog: broker {node_id} not registered and unfenced within {READY_TIMEOUT_S:.0f}s "
                     f"(it keeps running; `cluster status` lists it); see {log}\n")
    return 1


def removed_controller_ids(state: dict, broker_urls: list[str]) -> list[int] | None:
    """The controller ids the running quorum lists as removed (GET /v1/admin/quorum on some
    broker, as admin on a --secure cluster); None when no broker answered."""
    import urllib.request
    tls_ctx = client_ssl_context(_node_config(state, 1)) if state.get("secure") else None
    for url in broker_urls:
        try:
            req = urllib.request.Request(url + "/v1/admin/quorum", headers=admin_headers(state))
            with urllib.request.urlopen(req, timeout=5, context=tls_ctx) as r:
                return [int(i) for i in json.loads(r.read()).get("removed", [])]
        except (OSError, ValueError):
            continue
    return None


def _stop(pids: list[int], timeout: float) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    for pid in pids:
        if alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    # gone before `down` returns: an `up` right after must find its ports and data-dir locks free
    deadline = time.monotonic() + KILL_WAIT_S
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)


def down(args: argparse.Namespace) -> int:
    data_dir = os.path.abspath(args.data_dir)
    state = load_state(data_dir)
    if state is None:
        sys.stderr.write(f"kraftlog: no cluster in {data_dir} (no {STATE_FILE}); check --data-dir\n")
        return 1
    procs = state.get("processes", [])
    removed = removed_controller_ids(state, [p["url"] for p in procs if p["role"] == "broker" and alive(p["pid"])])
    if removed is not None:   # `up` must not start a controller the quorum removed (it would stop at once)
        state["removed_controllers"] = sorted(set(state.get("removed_controllers", [])) | set(removed))
    # brokers first (controlled shutdown needs the controllers), then controllers
    _stop([p["pid"] for p in procs if p["role"] == "broker" and alive(p["pid"])], STOP_TIMEOUT_S)
    _stop([p["pid"] for p in procs if p["role"] == "controller" and alive(p["pid"])], STOP_TIMEOUT_S)
    stop_object_store(state)   # --tiered-storage: the SeaweedFS, once no broker uses it
    state["processes"] = []
    save_state(data_dir, state)
    print(f"stopped the cluster in {data_dir}")
    return 0


def status(args: argparse.Namespace) -> int:
    data_dir = os.path.abspath(args.data_dir)
    state = load_state(data_dir)
    if state is None:
        sys.stderr.write(f"kraftlog: no cluster in {data_dir} (no {STATE_FILE}); check --data-dir\n")
        return 1
    procs = [p for p in state.get("processes", []) if alive(p["pid"])]
    if getattr(args, "output", "text") == "json":
        print(json.dumps([{"node_id": p["node_id"], "role": p["role"], "pid": p["pid"], "url": p["url"],
                           **({"kafka_address": p["kafka_address"]} if "kafka_address" in p else {})}
                          for p in procs]))
        return 0
    if not procs:
        print(f"cluster in {data_dir}: stopped")
        return 0
    print(f"{'node':<6}{'role':<12}{'pid':<10}url")
    for p in procs:
        print(f"{p['node_id']:<6}{p['role']:<12}{p['pid']:<10}{p['url']}")
    return 0


def main(args: argparse.Namespace) -> int:
    return {"up": up, "down": down, "status": status, "add-broker": add_broker}[args.cluster_cmd](args)
