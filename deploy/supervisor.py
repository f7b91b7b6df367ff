"""Combined mode: one controller process and one broker process, supervised together.

The two children run in their own session (a terminal's Ctrl-C reaches only the
supervisor, which then stops them in order: broker first, so its controlled shutdown can
still talk to the controller, then the controller). Each child also gets
PR_SET_PDEATHSIG=SIGTERM on Linux, so it dies with the supervisor even on kill -9. With
TLS on, SIGHUP is forwarded to both children: they reload their certificate pairs.
"""
from __future__ import annotations

import dataclasses
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Optional

from deploy.config import NodeConfig
from http_api.wire.hardening import HttpLimits

READY_TIMEOUT_S = 60.0
BROKER_STOP_TIMEOUT_S = 25.0
CONTROLLER_STOP_TIMEOUT_S = 10.0
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _set_pdeathsig() -> None:
    try:
        import ctypes
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


BROKER_PASSWORD_FILE = "broker.password"                  # this node's broker password (0600)
BROKER_CREDENTIALS_FILE = "broker-credentials.json"      # its SCRAM verifier (no password)


def ensure_broker_credentials(cfg: NodeConfig) -> NodeConfig:
    """A secured node whose broker has no TLS client certificate to prove it is
    `User:broker-<id>` gets a broker password: generated once into DATA_DIR/broker.password,
    its verifier into DATA_DIR/broker-credentials.json, and both set as `broker_password_file`
    / `broker_credentials_file` (the controller checks the broker with the verifier). Settings
    given in the config win: a multi-node cluster without TLS lists every broker's verifier in
    one `broker_credentials_file` (http_api.wire.auth.write_broker_credentials) on every node."""
    sec = cfg.broker.security
    has_cert = "mtls" in sec.authentication and bool(sec.tls_cert_file)
    if not sec.secured or sec.broker_password_file or has_cert:
        return cfg
    from http_api.wire.auth import write_broker_credentials
    os.makedirs(cfg.data_dir, exist_ok=True)
    pw_path = os.path.join(cfg.data_dir, BROKER_PASSWORD_FILE)
    if not os.path.exists(pw_path):
        fd = os.open(pw_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32) + "\n")
    creds = sec.broker_credentials_file or os.path.join(cfg.data_dir, BROKER_CREDENTIALS_FILE)
    if not sec.broker_credentials_file:
        with open(pw_path) as f:
            write_broker_credentials(creds, {cfg.node_id: f.read().strip()})
    from http_api.broker.config import BrokerConfig
    broker = BrokerConfig(**{**cfg.broker.to_dict(), "broker_password_file": pw_path,
                             "broker_credentials_file": creds})
    return dataclasses.replace(cfg, broker=broker)


def raft_password(cfg: NodeConfig) -> str:
    """The configured password, else one generated once and kept in <data_dir>/raft.password."""
    if cfg.password:
        return cfg.password
    path = os.path.join(cfg.data_dir, "raft.password")
    if os.path.exists(path):
        with open(path) as f:
            return f.read().strip()
    os.makedirs(cfg.data_dir, exist_ok=True)
    pw = secrets.token_hex(16)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(pw + "\n")
    return pw


def lock_data_dir(path: str):
    """An exclusive lock on <path>/.lock held for the process's lifetime (None if taken)."""
    import fcntl
    fd = os.open(os.path.join(path, ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def controller_command(cfg: NodeConfig) -> list[str]:
    """The controller process of `cfg`: its listeners, the quorum and `cfg.controller` as flags."""
    c = cfg.controller
    return [sys.executable, "-m", "metadata_quorum.controller_server", "--node-id", str(cfg.node_id),
            "--data-dir", cfg.controller_data_dir(), "--http-host", cfg.http_host,
            "--http-port", str(cfg.controller_port), "--raft-port", str(cfg.raft_port),
            "--voters", cfg.voters, "--cluster-id", cfg.cluster_id, "--log-level", cfg.log_level,
            "--min-insync-replicas", str(c.min_insync_replicas),
            "--broker-session-timeout-ms", str(c.broker_session_timeout_ms),
            "--broker-heartbeat-interval-ms", str(c.broker_heartbeat_interval_ms),
            "--leader-imbalance-check-interval-ms", str(c.leader_imbalance_check_interval_ms),
            "--broker-silence-fence-ms", str(c.broker_silence_fence_ms),
            "--broker-silence-report-max-age-ms", str(c.broker_silence_report_max_age_ms)] + \
        (["--raft-bind-host", cfg.raft_bind_host] if cfg.raft_bind_host else []) + \
        (["--join"] if cfg.controller_quorum_join else []) + \
        security_args(cfg) + http_limits_args(cfg)


def http_limits_args(cfg: NodeConfig) -> list[str]:
    """The node's HTTP edge limits (the broker's request_header_timeout_ms, connections_max, ...)
    for the controller's listener too (none when at defaults)."""
    limits = HttpLimits.from_settings(cfg.broker)
    if limits == HttpLimits():
        return []
    return ["--http-limits-json", json.dumps(dataclasses.asdict(limits))]


def security_args(cfg: NodeConfig) -> list[str]:
    """The node's [security] settings for the controller process (none when at defaults)."""
    sec = cfg.broker.security
    if sec == type(sec)():
        return []
    return ["--security-json", json.dumps(dataclasses.asdict(sec))]


def client_ssl_context(cfg: NodeConfig):
    """What the supervisor's own health checks verify the node's https listeners with."""
    from http_api.wire.tls import internal_client_context
    return internal_client_context(cfg.broker.security)


def broker_command(cfg: NodeConfig) -> list[str]:
    """The broker process of `cfg`: `cfg.broker` as flat JSON settings."""
    return [sys.executable, "-m", "http_api.broker.server", "--config-json", json.dumps(cfg.broker.to_dict()),
            "--log-level", cfg.log_level]


def broker_env(cfg: NodeConfig, env: dict) -> dict:
    """The environment of `cfg`'s broker process: the controllers' `env`, without the raft
    secret once [security] authentication is on (brokers are cluster principals then; the
    secret that can write the metadata log stays with the controllers)."""
    if cfg.broker.security.secured:
        return {k: v for k, v in env.items() if k != "KRAFTLOG_RAFT_PASSWORD"} | {"KRAFTLOG_RAFT_PASSWORD": ""}
    return env


def spawn(cmd: list[str], env_extra: dict | None = None, log_path: str | None = None,
          detach: bool = False) -> subprocess.Popen:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(env_extra or {})
    out = None
    if log_path is not None:
        out = open(log_path, "ab")
    try:
        return subprocess.Popen(cmd, env=env, cwd=os.getcwd(), start_new_session=True,
                                preexec_fn=None if detach else _set_pdeathsig,
                                stdout=out, stderr=subprocess.STDOUT if out else None,
                                stdin=subprocess.DEVNULL)
    finally:
        if out is not None:
            out.close()


def http_ok(url: str, timeout: float = 1.0, ssl_context=None, headers: dict | None = None) -> bool:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=timeout,
                                    context=ssl_context) as r:
            return r.status == 200
    except Exception:
        return False


def stop_process(p: subprocess.Popen, timeout: float) -> None:
    if p.poll() is not None:
        return
    try:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(5)
    except ProcessLookupError:
        pass


def serve_combined(cfg: NodeConfig) -> int:
    """Run controller + broker until Ctrl-C / SIGTERM; returns the exit code."""
    for name, port in (("--http-port", cfg.http_port), ("--controller-port", cfg.controller_port),
                       ("--raft-port", cfg.raft_port)):
        if port_in_use(cfg.http_host, port):
            sys.stderr.write(f"kraftlog: port {port} ({name}) on {cfg.http_host} is already in use: stop the "
                             f"process using it (another kraftlog?) or pass a different {name}\n")
            return 1
    os.makedirs(cfg.data_dir, exist_ok=True)
    lock = lock_data_dir(cfg.data_dir)
    if lock is None:
        sys.stderr.write(f"kraftlog: data dir {cfg.data_dir} is in use by another kraftlog process; stop it "
                         "first or pass a different --data-dir\n")
        return 1
    env = {"KRAFTLOG_RAFT_PASSWORD": raft_password(cfg)}
    cfg = ensure_broker_credentials(cfg)   # secured without a broker certificate: a broker password

    stopping = {"sig": None}
    children: list[subprocess.Popen] = []

    def on_signal(signum, _frame):
        stopping["sig"] = signum

    def on_hup(_signum, _frame):   # reload TLS certificates: both children reload theirs
        for p in children:
            if p.poll() is None:
                p.send_signal(signal.SIGHUP)

    tls_ctx = client_ssl_context(cfg)
    old_int = signal.signal(signal.SIGINT, on_signal)
    old_term = signal.signal(signal.SIGTERM, on_signal)
    old_hup = signal.signal(signal.SIGHUP, on_hup) if tls_ctx is not None else None
    controller = spawn(controller_command(cfg), env)
    broker = spawn(broker_command(cfg), broker_env(cfg, env))   # without [security]: guards /internal/ with it
    children += [controller, broker]
    code = 0
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        ready = False
        while stopping["sig"] is None:
            for name, p in (("controller", controller), ("broker", broker)):
                if p.poll() is not None:
                    sys.stderr.write(f"kraftlog: the {name} process exited with code {p.returncode} during "
                                     "startup; see its log above\n")
                    return 1
            if http_ok(cfg.broker_url + "/healthz", ssl_context=tls_ctx):
                ready = True
                break
            if time.monotonic() > deadline:
                sys.stderr.write(f"kraftlog: the broker did not become ready within {READY_TIMEOUT_S:.0f}s; "
                                 "see the logs above\n")
                return 1
            time.sleep(0.1)
        if ready:
            sys.stdout.write(f"kraftlog node {cfg.node_id} ready: broker {cfg.broker_url} "
                             f"(controller {cfg.controller_url}, data in {cfg.data_dir}); Ctrl-C to stop\n")
            sys.stdout.write(cfg.broker_url + "\n")
            sys.stdout.flush()
        while stopping["sig"] is None:
            for name, p in (("controller", controller), ("broker", broker)):
                if p.poll() is not None:
                    sys.stderr.write(f"kraftlog: the {name} process exited unexpectedly (code {p.returncode}); "
                                     "stopping the node — see its log above, then run kraftlog serve again\n")
                    code = 1
                    stopping["sig"] = -1
                    break
            time.sleep(0.2)
        return code
    finally:
        stop_process(broker, BROKER_STOP_TIMEOUT_S)
        stop_process(controller, CONTROLLER_STOP_TIMEOUT_S)
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)
        if old_hup is not None:
            signal.signal(signal.SIGHUP, old_hup)
        if stopping["sig"] not in (None, -1):
            sys.stdout.write("kraftlog stopped cleanly\n")
            sys.stdout.flush()
