"""A real-process kraftlog cluster for fault injection: N controllers + N brokers, every
broker reached through TCP proxies.

Layout under `root`: node-<i>/controller-<i>/ (raft journal), node-<i>/broker-<i>/ (logs,
state), controller.log, broker.log.

Wiring (free ports on loopback):
- broker i listens on 127.0.0.1:`http_port[i]` and advertises its proxy
  `broker_proxy[i]` in metadata, so replica fetchers of the other brokers (and forwarded
  requests) reach it through that proxy;
- controller j listens on 127.0.0.1:`ctl_port[j]` and is named 127.0.0.2:`ctl_port[j]` in
  the voters list, where `ctl_proxy[j]` listens: brokers (configured with those URLs) and
  NOT_CONTROLLER redirects (leader_url comes from the voters list) both go through it;
- the proxies know which process connects (see proxy.py), so a fault is set per link:
  `link(src, dst)` = (proxy of dst, label of src);
- controller j's raft port listens on 127.0.0.1:`raft_port[j]` (`--raft-bind-host`) and is
  named 127.0.0.2:`raft_port[j]` in the voters list, where `raft_proxy[j]` listens: every
  raft connection between controllers crosses a proxy, so raft links can be cut per link;
- the workload clients talk to brokers directly (`direct_url`), so client traffic is never
  cut by accident.

Processes are children started with PR_SET_PDEATHSIG: they die with the harness. Each
runs in a session (process group) of its own: a broker's log cleaner child process (spawned
by the broker, `log_cleaner_process`) is in its group, so kill -9 of a broker kills the
group, as a machine or container dying would (a cleaner child outliving its broker would
otherwise stay behind, idle, for good).

The log cleaner and retention run as in production, only faster: small segments, a short
`log_cleaner_backoff_ms` and `log_retention_check_interval_ms` (the workload's compacted
topic sets a low `min.cleanable.dirty.ratio` and `delete.retention.ms`), so compaction,
tombstone expiry and the retention checks all happen, under faults, in a short run.

`ClusterSettings(secure=True)`: security on as `kraftlog cluster up --secure` sets it
(deploy/cluster.py's make_secrets() and security_settings(): a CA and `broker-<i>`
certificates under `root`, TLS on every listener, authentication basic + mtls, the ACL
authorizer, super users admin and every broker, admin bootstrapped from
bootstrap-users.json); the node certificates also name CONTROLLER_HOST (the voters' and
proxies' address). The harness's own clients verify the cluster CA (`ssl_context`) and
authenticate as the super user admin (`auth_header()`, `admin_password`). The proxies
forward the TLS bytes unchanged.
"""
from __future__ import annotations

import base64
import dataclasses
import errno
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Optional

from tests.chaos.harness.proxy import DEFAULT_LOOP, RAFT_LOOP, Proxy, free_port
from tests.chaos.harness.proxy_host import ProxyHost

CONTROLLER_HOST = "127.0.0.2"
COPY_ATTEMPTS = 5                # copy_broker_logs: tries while the broker deletes files   # controllers are advertised (and proxied) here
CLOCK_SHIM_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "clockshim")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _free_on_both() -> int:
    """A port free on 127.0.0.1 (the controller's raft bind) and CONTROLLER_HOST (its proxy)."""
    import socket
    for _ in range(50):
        port = free_port(CONTROLLER_HOST)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise RuntimeError("no port free on both 127.0.0.1 and " + CONTROLLER_HOST)


def _address_in_use(e: BaseException) -> bool:
    """A bind that lost a port race (the proxy host reports its OSError as a RuntimeError)."""
    return getattr(e, "errno", None) == errno.EADDRINUSE or "address already in use" in str(e).lower()


PORT_ATTEMPTS = 20   # ChaosCluster: binds of a CONTROLLER_HOST proxy retried on a new port


def _group_orphans(pgid: int) -> list[int]:
    """Processes of group `pgid` left by its dead leader: reparented (to init or a subreaper)
    outside the group. A new process that reused the pid as its group (our child, or the
    children of that child) is not one of them."""
    table: dict[int, tuple[int, int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] in ("Z", "X"):   # dead, not yet reaped
            continue
        table[int(name)] = (int(fields[1]), int(fields[2]))   # ppid, pgrp
    return [pid for pid, (ppid, pgrp) in table.items()
            if pgrp == pgid and ppid != os.getpid() and table.get(ppid, (0, -1))[1] != pgid]


def _http_json(url: str, timeout: float = 1.0, ssl_context=None, headers: Optional[dict] = None) -> Optional[dict]:
    try:
        req = urllib.request.Request(url, headers=headers or {})
        with urllib.request.urlopen(req, timeout=timeout, context=ssl_context) as r:
            return json.loads(r.read())
    except Exception:
        return None


@dataclass
class ProcessSpec:
    role: str          # controller | broker
    node_id: int
    cmd: list
    env: dict
    log_path: str
    proc: Optional[subprocess.Popen] = None
    paused: bool = False
    fsize_limit_bytes: Optional[int] = None   # RLIMIT_FSIZE for the next start (disk full)

    @property
    def pid(self) -> Optional[int]:
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class ClusterSettings:
    """Knobs of the chaos cluster (broker settings are BrokerConfig field names)."""

    nodes: int = 3
    log_level: str = "WARNING"
    broker_session_timeout_ms: int = 3000
    broker_heartbeat_interval_ms: int = 500
    secure: bool = False   # TLS + authentication + ACLs, as `kraftlog cluster up --secure`
    raft_prevote: bool = False   # controllers run raft pre-vote (--raft-prevote)
    raft_options: dict = field(default_factory=dict)   # controller raft flags, e.g. {"--raft-max-timeout-s": 1.0}
    proxy_processes: bool = True   # the proxies run in processes of their own (harness/proxy_host.py)
    broker: dict = field(default_factory=lambda: {
        "replica_lag_time_max_ms": 3000, "request_timeout_ms": 5000, "min_insync_replicas": 2,
        "default_replication_factor": 3, "replica_fetch_wait_max_ms": 200, "replica_fetch_backoff_ms": 100,
        "offsets_commit_timeout_ms": 3000,
        # the log cleaner on, as in production (its passes in a child process), but eager
        "log_cleaner_enable": True, "log_cleaner_process": True, "log_cleaner_backoff_ms": 300,
        "log_retention_check_interval_ms": 1000,
    })


class ChaosCluster:
    """Start, kill, pause, restart and partition the processes of one cluster."""

    def __init__(self, root: str, settings: Optional[ClusterSettings] = None):
        self.root = os.path.abspath(root)
        self.s = settings or ClusterSettings()
        n = self.s.nodes
        self.ids = list(range(1, n + 1))
        self.cluster_id = f"chaos-{os.getpid()}-{int(time.time())}"
        self.password = "chaos-" + os.urandom(8).hex()
        self.scheme = "https" if self.s.secure else "http"
        self.security: dict[int, dict] = {}       # node id -> [security] settings (secure only)
        self.ssl_context = None                   # what the harness's clients verify the CA with
        self.admin_user: Optional[str] = None
        self.admin_password: Optional[str] = None
        self.http_port = {i: free_port() for i in self.ids}
        self.ctl_port = {i: _free_on_both() for i in self.ids}
        self.raft_port = {i: _free_on_both() for i in self.ids}
        self.procs: dict[tuple[str, int], ProcessSpec] = {}
        # the proxies: in two processes of their own (raft links apart from HTTP links), or in
        # loops of this process (proxy.py); either way the same interface
        self.proxy_hosts: list[ProxyHost] = []
        if self.s.proxy_processes:
            http_host = ProxyHost("chaos-proxy-http", DEFAULT_LOOP)
            self.proxy_hosts.append(http_host)
            raft_host = ProxyHost("chaos-proxy-raft", RAFT_LOOP)
            self.proxy_hosts.append(raft_host)

            def make(target, name, loop_name, **kw):
                h = raft_host if loop_name == RAFT_LOOP else http_host
                return h.open(target, name, resolve=True, **kw)
        else:
            def make(target, name, loop_name, **kw):
                return Proxy(target, name, resolver=self.source_label, loop_name=loop_name, **kw)
        self.broker_proxy, self.ctl_proxy, self.raft_proxy = {}, {}, {}
        try:
            for i in self.ids:
                self.broker_proxy[i] = make(self.http_port[i], f"broker-{i}", DEFAULT_LOOP, scheme=self.scheme)
            for j in self.ids:
                self.ctl_proxy[j] = self._open_on_controller_host(make, self.ctl_port, j, f"controller-{j}",
                                                                  DEFAULT_LOOP, scheme=self.scheme)
                self.raft_proxy[j] = self._open_on_controller_host(make, self.raft_port, j, f"raft-{j}",
                                                                   RAFT_LOOP)   # never behind HTTP storms
        except BaseException:
            for p in [*self.broker_proxy.values(), *self.ctl_proxy.values(), *self.raft_proxy.values()]:
                p.close()
            for h in self.proxy_hosts:
                h.close()
            raise
        os.makedirs(self.root, exist_ok=True)
        if self.s.secure:
            self._make_secrets()
        for i in self.ids:
            self.procs[("controller", i)] = self._controller_spec(i)
            self.procs[("broker", i)] = self._broker_spec(i)

    @staticmethod
    def _open_on_controller_host(make, ports: dict, j: int, name: str, loop_name: str, **kw):
        """The proxy of CONTROLLER_HOST:`ports[j]` (the same port number as its target on
        127.0.0.1, as the voters list names it). The port was free when it was picked, but
        another process may take it before the proxy binds it: then a new port free on both
        hosts is picked (`ports[j]` updated; the process specs are built afterwards)."""
        for attempt in range(PORT_ATTEMPTS):
            try:
                return make(ports[j], name, loop_name, host=CONTROLLER_HOST, port=ports[j], **kw)
            except (OSError, RuntimeError) as e:
                if not _address_in_use(e) or attempt == PORT_ATTEMPTS - 1:
                    raise
                ports[j] = _free_on_both()

    # ---- security ----------------------------------------------------------------------

    def _make_secrets(self) -> None:
        """CA, node certificates, admin password and bootstrap credential, by deploy/cluster.py's
        own functions (its layout: root/ca.pem, root/node-<i>/tls/, root/admin.password)."""
        from deploy.certs import CertificateAuthority, default_hosts, ensure_node_certificate
        from deploy.cluster import ADMIN_PASSWORD_FILE, ADMIN_USER, make_secrets, security_settings
        from http_api.wire.tls import client_context
        state = {"data_dir": self.root, "nodes": len(self.ids), "secure": True}
        ca = CertificateAuthority.load_or_create(self.root)
        for i in self.ids:   # issued first so the SANs name CONTROLLER_HOST too; make_secrets keeps them
            ensure_node_certificate(ca, self.node_dir(i), f"broker-{i}", default_hosts() + [CONTROLLER_HOST])
        make_secrets(state)
        self.security = {i: security_settings(state, i) for i in self.ids}
        self.ssl_context = client_context(ca_file=ca.cert_path)
        self.admin_user = ADMIN_USER
        with open(os.path.join(self.root, ADMIN_PASSWORD_FILE)) as f:
            self.admin_password = f.read().strip()

    def auth_header(self) -> dict:
        """The Authorization header of the harness's clients (the super user admin; none when
        security is off)."""
        if self.admin_password is None:
            return {}
        token = base64.b64encode(f"{self.admin_user}:{self.admin_password}".encode()).decode()
        return {"Authorization": "Basic " + token}

    def get_json(self, url: str, timeout: float = 1.0) -> Optional[dict]:
        """GET `url` as the harness (CA-verified TLS and admin's credentials when secure);
        None on any failure."""
        return _http_json(url, timeout=timeout, ssl_context=self.ssl_context, headers=self.auth_header())

    def anonymous_status(self, i: int) -> Optional[int]:
        """The HTTP status broker i answers GET /v1/topics sent without credentials (TLS
        verified): 401 once authentication is on, 200 without security; None if unreachable."""
        try:
            with urllib.request.urlopen(self.direct_url(i) + "/v1/topics", timeout=5.0, context=self.ssl_context) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code
        except Exception:
            return None

    # ---- process specs -----------------------------------------------------------------

    def node_dir(self, i: int) -> str:
        return os.path.join(self.root, f"node-{i}")

    def broker_log_dir(self, i: int) -> str:
        return os.path.join(self.node_dir(i), f"broker-{i}", "logs")

    def _controller_spec(self, i: int) -> ProcessSpec:
        voters = ",".join(f"{j}@{CONTROLLER_HOST}:{self.raft_port[j]}:{self.ctl_port[j]}" for j in self.ids)
        cmd = [sys.executable, "-m", "metadata_quorum.controller_server", "--node-id", str(i),
               "--data-dir", os.path.join(self.node_dir(i), f"controller-{i}"), "--http-host", "127.0.0.1",
               "--http-port", str(self.ctl_port[i]), "--raft-port", str(self.raft_port[i]), "--voters", voters,
               "--raft-bind-host", "127.0.0.1",
               "--cluster-id", self.cluster_id, "--log-level", self.s.log_level,
               "--broker-session-timeout-ms", str(self.s.broker_session_timeout_ms),
               "--broker-heartbeat-interval-ms", str(self.s.broker_heartbeat_interval_ms),
               "--min-insync-replicas", str(self.s.broker.get("min_insync_replicas", 1))]
        if self.security:
            cmd += ["--security-json", json.dumps(self.security[i])]
        if self.s.raft_prevote:
            cmd += ["--raft-prevote"]
        for flag, value in sorted(self.s.raft_options.items()):
            cmd += [flag, str(value)]
        return ProcessSpec("controller", i, cmd, {"KRAFTLOG_RAFT_PASSWORD": self.password},
                           os.path.join(self.node_dir(i), "controller.log"))

    def _broker_spec(self, i: int) -> ProcessSpec:
        from http_api.broker.config import BrokerConfig

        state = os.path.join(self.node_dir(i), f"broker-{i}")
        cfg = BrokerConfig(broker_id=i, cluster_id=self.cluster_id, http_host="127.0.0.1",
                           http_port=self.http_port[i], advertised_url=self.broker_proxy[i].url,
                           kafka_port=0,   # no Kafka listener: the harness speaks HTTP (and leaves 9092 free)
                           log_dirs=[os.path.join(state, "logs")], state_dir=state,
                           controller_urls=[self.ctl_proxy[j].url for j in self.ids], **self.s.broker,
                           **self.security.get(i, {}))
        cmd = [sys.executable, "-m", "http_api.broker.server", "--config-json",
               json.dumps(dataclasses.asdict(cfg)), "--log-level", self.s.log_level]
        # secure: no raft secret for brokers (deploy/supervisor.broker_env); they are User:broker-<i>
        env = {"KRAFTLOG_RAFT_PASSWORD": ""} if self.security else {}
        return ProcessSpec("broker", i, cmd, env, os.path.join(self.node_dir(i), "broker.log"))

    # ---- lifecycle ---------------------------------------------------------------------

    def child_env(self, spec: ProcessSpec) -> dict:
        """The environment of a cluster process. Bytecode is cached under the cluster root
        (`PYTHONPYCACHEPREFIX`) even when the harness runs with PYTHONDONTWRITEBYTECODE: a
        deployed kraftlog starts from compiled modules (pip writes them at install), and
        compiling every module from source again at each restart of a killed broker cost
        ~0.25 s of CPU, 1-1.5 s of wall time on a loaded machine, before it could rejoin
        the ISR (issue 24: the windows after kill-several)."""
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([CLOCK_SHIM_DIR, ROOT] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        env["KRAFTLOG_CHAOS_CLOCK_FILE"] = self.clock_file(spec.role, spec.node_id)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = os.path.join(self.root, "pycache")
        env.update(spec.env)
        return env

    def _spawn(self, spec: ProcessSpec) -> None:
        os.makedirs(os.path.dirname(spec.log_path), exist_ok=True)
        env = self.child_env(spec)
        limit = spec.fsize_limit_bytes

        def preexec():
            try:
                import ctypes
                ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
            except Exception:
                pass
            if limit is not None:
                resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

        with open(spec.log_path, "ab") as out:
            out.write(f"\n==== chaos: start {spec.role} {spec.node_id} at {time.time():.3f}"
                      f"{' RLIMIT_FSIZE=%d' % limit if limit is not None else ''} ====\n".encode())
            out.flush()
            spec.proc = subprocess.Popen(spec.cmd, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, preexec_fn=preexec, start_new_session=True)
        spec.paused = False
        self._push_labels()

    def start(self, ready_timeout_s: float = 90.0) -> None:
        for i in self.ids:
            self._spawn(self.procs[("controller", i)])
        for i in self.ids:
            self._spawn(self.procs[("broker", i)])
        self.wait_ready(ready_timeout_s)

    def wait_ready(self, timeout_s: float = 60.0, brokers: Optional[list] = None) -> None:
        deadline = time.monotonic() + timeout_s
        pending = list(brokers or self.ids)
        while pending:
            for i in pending:
                spec = self.procs[("broker", i)]
                if spec.proc is not None and spec.proc.poll() is not None:
                    raise RuntimeError(f"broker {i} exited with {spec.proc.returncode}; see {spec.log_path}")
            pending = [i for i in pending if not self._healthy(i)]
            if pending and time.monotonic() > deadline:
                raise RuntimeError(f"brokers {pending} not ready within {timeout_s}s; logs under {self.root}")
            if pending:
                time.sleep(0.2)

    def _healthy(self, i: int) -> bool:
        try:
            with urllib.request.urlopen(self.direct_url(i) + "/healthz", timeout=1.0, context=self.ssl_context) as r:
                return r.status == 200
        except Exception:
            return False

    @staticmethod
    def _kill_group(spec: ProcessSpec) -> None:
        """SIGKILL the process's group (it and its children, e.g. a broker's cleaner process).
        Once the leader is gone its pid may be reused: then only orphans left in its group
        (reparented away from us) are killed, one by one."""
        if spec.proc is None:
            return
        if spec.proc.poll() is None:
            try:
                os.killpg(spec.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            return
        for pid in _group_orphans(spec.proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def stop(self) -> None:
        """kill -9 everything (a test cluster: nothing to shut down cleanly), close the proxies."""
        for spec in self.procs.values():
            self._kill_group(spec)
        for spec in self.procs.values():
            if spec.proc is not None:
                try:
                    spec.proc.wait(10)
                except subprocess.TimeoutExpired:
                    pass
        for p in self.all_proxies():
            p.close()
        for h in self.proxy_hosts:
            h.close()

    # ---- faults on processes -----------------------------------------------------------

    def kill(self, role: str, i: int) -> None:
        """kill -9 the process; its proxies refuse new connections until it listens again, as
        a dead process's ports do (proxy.py, "A dead target is mirrored")."""
        spec = self.procs[(role, i)]
        if spec.proc is not None:
            self._kill_group(spec)   # also a cleaner child left by a broker that died by itself
            try:
                spec.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        spec.paused = False
        self._push_labels()
        for proxy in self.proxies_of(role, i):
            proxy.target_down()

    def proxies_of(self, role: str, i: int) -> list:
        """The proxies standing in front of one process's ports."""
        if role == "broker":
            return [self.broker_proxy[i]]
        return [self.ctl_proxy[i], self.raft_proxy[i]]

    def restart(self, role: str, i: int, fsize_limit_bytes: Optional[int] = None) -> None:
        spec = self.procs[(role, i)]
        self.kill(role, i)   # alive or not: also what a dead process left in its group
        spec.fsize_limit_bytes = fsize_limit_bytes
        self._spawn(spec)

    def pause(self, role: str, i: int) -> None:
        spec = self.procs[(role, i)]
        if spec.alive() and not spec.paused:
            os.kill(spec.pid, signal.SIGSTOP)
            spec.paused = True

    def resume(self, role: str, i: int) -> None:
        spec = self.procs[(role, i)]
        if spec.alive() and spec.paused:
            os.kill(spec.pid, signal.SIGCONT)
        spec.paused = False

    def clock_file(self, role: str, i: int) -> str:
        return os.path.join(self.root, f"clock-offset-{role}-{i}")

    def set_clock_offset(self, role: str, i: int, seconds: float) -> None:
        """Jump the wall clock of one process (time.time via clockshim/sitecustomize.py)."""
        path = self.clock_file(role, i)
        with open(path + ".tmp", "w") as f:
            f.write(repr(float(seconds)))
        os.replace(path + ".tmp", path)

    def alive(self, role: str, i: int) -> bool:
        return self.procs[(role, i)].alive()

    # ---- addresses & state -------------------------------------------------------------

    def direct_url(self, i: int) -> str:
        return f"{self.scheme}://127.0.0.1:{self.http_port[i]}"

    def controller_direct_url(self, j: int) -> str:
        return f"{self.scheme}://127.0.0.1:{self.ctl_port[j]}"

    def url_map(self) -> dict[str, str]:
        """Advertised (proxy) broker URL -> direct URL, for clients."""
        return {self.broker_proxy[i].url: self.direct_url(i) for i in self.ids}

    def active_controller(self) -> Optional[int]:
        for i in self.ids:
            spec = self.procs[("controller", i)]
            if not spec.alive() or spec.paused:
                continue
            st = self.get_json(self.controller_direct_url(i) + "/controller/v1/status", timeout=0.5)
            if st and st.get("is_active"):
                return i
        return None

    def settle_snapshot(self):
        """The inputs of harness/settle.py's `unsettled_reasons`, read now: which processes
        run, which brokers answer /healthz, the active controller and its metadata."""
        from tests.chaos.harness.settle import SettleSnapshot
        snap = SettleSnapshot(broker_ids=list(self.ids),
                              processes_up={key: spec.alive() and not spec.paused for key, spec in self.procs.items()})
        snap.healthy_brokers = {i for i in self.ids if snap.processes_up[("broker", i)] and self._healthy(i)}
        snap.active_controller = self.active_controller()
        if snap.active_controller is not None:
            snap.metadata = self.get_json(self.controller_direct_url(snap.active_controller)
                                          + "/controller/v1/metadata", timeout=2.0)
        return snap

    def process_labels(self) -> dict:
        """pid -> source label ("broker-2") of every live process of the cluster."""
        return {spec.pid: f"{role}-{i}" for (role, i), spec in self.procs.items() if spec.alive()}

    def _push_labels(self) -> None:
        """Tell the proxy processes who is who (before a new process can connect anywhere)."""
        labels = self.process_labels()
        for h in self.proxy_hosts:
            h.set_labels(labels)

    def source_label(self, peer_port: int, local_port: int) -> str:
        """Which of our processes opened this connection ("broker-2", "controller-1", else "client")."""
        pids = self.process_labels()
        from tests.chaos.harness.proxy import pid_of_peer
        pid = pid_of_peer(peer_port, local_port, list(pids))
        return pids.get(pid, "client")

    def all_proxies(self) -> list:
        return list(self.broker_proxy.values()) + list(self.ctl_proxy.values()) + list(self.raft_proxy.values())

    def proxy_faults(self) -> dict:
        """{"<what> <source>": count} summed over every proxy (see Proxy.faults)."""
        out: dict[str, int] = {}
        for p in self.all_proxies():
            for (what, label), n in p.faults.items():
                out[f"{what} {label}"] = out.get(f"{what} {label}", 0) + n
        return dict(sorted(out.items()))

    def heal_network(self) -> None:
        for p in self.all_proxies():
            p.heal()

    def raft_links(self, a: int, b: int) -> list:
        """(proxy, source label) of the raft connections between controllers a and b, both
        ways (pysyncobj keeps one connection per pair, opened by one side)."""
        return [(self.raft_proxy[b], f"controller-{a}"), (self.raft_proxy[a], f"controller-{b}")]

    def links_from(self, i: int) -> list:
        """(proxy, source label) of every link broker i opens: to other brokers and to controllers."""
        return [(self.broker_proxy[j], f"broker-{i}") for j in self.ids if j != i] + \
               [(self.ctl_proxy[j], f"broker-{i}") for j in self.ids]

    def links_to(self, i: int) -> list:
        """(proxy, source label) of every link other brokers open to broker i."""
        return [(self.broker_proxy[i], f"broker-{j}") for j in self.ids if j != i]

    def control_links(self, i: int) -> list:
        return [(self.ctl_proxy[j], f"broker-{i}") for j in self.ids]

    def copy_broker_logs(self, i: int, dest: str) -> None:
        """A copy of broker i's log dir as of now (for 'lost un-fsynced tail'). The broker runs
        meanwhile: a file its log cleaner or retention deletes mid-copy fails the copy, which is
        then taken again (a few tries)."""
        for attempt in range(COPY_ATTEMPTS):
            if os.path.exists(dest):
                shutil.rmtree(dest)
            try:
                shutil.copytree(self.broker_log_dir(i), dest, ignore_dangling_symlinks=True,
                                ignore=shutil.ignore_patterns("*.tmp", ".lock"))
                return
            except (shutil.Error, FileNotFoundError):
                if attempt == COPY_ATTEMPTS - 1:
                    raise
