"""Multi-host rig: N "hosts" as Linux network namespaces on one bridge (needs root + iproute2).

`NetnsRig(hosts=3)` creates, per run, a bridge in the root namespace and one namespace per
host, each joined to the bridge by a veth pair and given its own address on a private /24
picked so it collides with no route of the machine. Names carry a random run id
(`kl<6 hex>...`, within the 15-character interface limit), so parallel runs never collide.
Every host reaches every other host and the root namespace (where clients run) through the
bridge; each namespace has its own port space, so every host can use the same ports.

`cut(i)` isolates host i *silently*: its bridge port is set to the `disabled` STP state, so
the bridge drops every frame to and from the host, in both directions, with no RST, no ICMP
and no carrier change (the host still sees its link up, as when a switch or a cloud network
drops its traffic). Every namespace (and the root namespace) has permanent neighbour entries
for every host, so a cut never turns into a fast "no route to host" after ARP fails: peers see
nothing but timeouts. `heal(i)` sets the port back to `forwarding`. (netem is not available
on this kernel and there is no iptables/nft: a disabled bridge port is the silent drop.)

`spawn(i, cmd)` runs a process inside host i (`ip netns exec`). `close()` (also on `with`
exit, on failure too) kills every process of every namespace by pid, then deletes the veths,
the bridge and the namespaces.

`NetnsKraftlogCluster(rig, base_dir)` runs one combined-mode node (`kraftlog serve --config
nodeI.toml`: a controller and a broker, docs/OPERATIONS.md "A cluster on several machines")
in every host, with the standard ports and one TOML file per host; each node's output
(supervisor, controller and broker logs) goes to `base_dir/node-I.log`.
"""
from __future__ import annotations

import ipaddress
import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import time
from typing import Any, Callable, Optional

from tests.rigs.cluster import http

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

STATE_DISABLED = "0"     # bridge port states (bridge(8)): disabled drops everything
STATE_FORWARDING = "3"


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(list(args), capture_output=True, text=True)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({p.returncode}): {p.stderr.strip()}")
    return p


def _used_networks() -> list:
    """IPv4 networks already routed or assigned in the root namespace."""
    nets = []
    for r in json.loads(_run("ip", "-j", "-4", "route", "show", "table", "all").stdout or "[]"):
        dst = r.get("dst")
        if dst and dst != "default":
            try:
                nets.append(ipaddress.ip_network(dst if "/" in dst else dst + "/32", strict=False))
            except ValueError:
                pass
    for link in json.loads(_run("ip", "-j", "-4", "addr").stdout or "[]"):
        for a in link.get("addr_info", []):
            nets.append(ipaddress.ip_network(f"{a['local']}/{a['prefixlen']}", strict=False))
    return nets


def _free_subnet(rng: random.Random) -> ipaddress.IPv4Network:
    used = _used_networks()
    for _ in range(500):
        net = ipaddress.ip_network(f"10.{rng.randrange(64, 250)}.{rng.randrange(1, 255)}.0/24")
        if not any(net.overlaps(u) for u in used):
            return net
    raise RuntimeError("no free 10.x.y.0/24 subnet found for the netns rig; remove stale test bridges "
                       "(ip link show type bridge)")


class NetnsRig:
    """N network-namespace hosts on one bridge; see the module docstring. Host ids are 1..N.

    Invariants: every namespace, link and process the rig made is recorded before it is used,
    so `close()` removes exactly those (and nothing else), whatever failed halfway."""

    def __init__(self, hosts: int = 3, run_id: Optional[str] = None) -> None:
        if os.geteuid() != 0:
            raise RuntimeError("the netns rig needs root (ip netns add); run as root")
        for tool in ("ip", "bridge"):
            if shutil.which(tool) is None:
                raise RuntimeError(f"the netns rig needs iproute2's {tool!r}; install iproute2")
        self.hosts = list(range(1, hosts + 1))
        self.run_id = run_id or secrets.token_hex(3)
        self.bridge = f"kl{self.run_id}br"
        self.subnet: Optional[ipaddress.IPv4Network] = None
        self.namespaces: list[str] = []
        self.links: list[str] = []          # host-side veths and the bridge, root namespace
        self.procs: list[subprocess.Popen] = []
        self.cut_hosts: set[int] = set()
        self._macs: dict[int, str] = {}

    # ---- names ---------------------------------------------------------------------------

    def ns(self, i: int) -> str:
        return f"kl{self.run_id}h{i}"

    def veth(self, i: int) -> str:
        """The host-side (root namespace, bridge port) end of host i's veth pair."""
        return f"kl{self.run_id}v{i}"

    def ip(self, i: int) -> str:
        assert self.subnet is not None, "start() the rig first"
        return str(self.subnet.network_address + i)

    @property
    def gateway_ip(self) -> str:
        """The bridge's address in the root namespace (where clients run)."""
        assert self.subnet is not None
        return str(self.subnet.network_address + 254)

    # ---- lifecycle -----------------------------------------------------------------------

    def start(self) -> "NetnsRig":
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def _start(self) -> None:
        self.subnet = _free_subnet(random.Random(self.run_id))
        plen = self.subnet.prefixlen
        self.links.append(self.bridge)
        _run("ip", "link", "add", self.bridge, "type", "bridge", "stp_state", "0", "forward_delay", "0")
        _run("ip", "addr", "add", f"{self.gateway_ip}/{plen}", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        for i in self.hosts:
            ns, veth = self.ns(i), self.veth(i)
            self.namespaces.append(ns)
            _run("ip", "netns", "add", ns)
            self.links.append(veth)
            _run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _run("ip", "link", "set", veth, "master", self.bridge)
            _run("ip", "link", "set", veth, "up")
            _run("ip", "-n", ns, "addr", "add", f"{self.ip(i)}/{plen}", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            info = json.loads(_run("ip", "-n", ns, "-j", "link", "show", "eth0").stdout)
            self._macs[i] = info[0]["address"]
        bridge_mac = json.loads(_run("ip", "-j", "link", "show", self.bridge).stdout)[0]["address"]
        # permanent neighbours everywhere: a cut host is silent, never "no route to host"
        for i in self.hosts:
            for j in self.hosts:
                if i != j:
                    _run("ip", "-n", self.ns(i), "neigh", "replace", self.ip(j), "lladdr", self._macs[j],
                         "dev", "eth0", "nud", "permanent")
            _run("ip", "-n", self.ns(i), "neigh", "replace", self.gateway_ip, "lladdr", bridge_mac,
                 "dev", "eth0", "nud", "permanent")
            _run("ip", "neigh", "replace", self.ip(i), "lladdr", self._macs[i], "dev", self.bridge,
                 "nud", "permanent")

    def spawn(self, i: int, cmd: list[str], *, log_path: Optional[str] = None, env: Optional[dict] = None,
              cwd: str = ROOT) -> subprocess.Popen:
        """Run `cmd` inside host i (its own session); output to `log_path` (else discarded)."""
        out = open(log_path, "ab") if log_path else subprocess.DEVNULL
        try:
            p = subprocess.Popen(["ip", "netns", "exec", self.ns(i), *cmd], cwd=cwd,
                                 env={**os.environ, **(env or {})}, stdout=out, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            if log_path:
                out.close()
        self.procs.append(p)
        return p

    def exec(self, i: int, cmd: list[str], timeout: float = 30.0) -> subprocess.CompletedProcess:
        """Run `cmd` inside host i to completion."""
        return subprocess.run(["ip", "netns", "exec", self.ns(i), *cmd], capture_output=True, text=True,
                              timeout=timeout)

    def cut(self, i: int) -> None:
        """Isolate host i silently: the bridge drops every frame to and from it (no RST)."""
        _run("bridge", "link", "set", "dev", self.veth(i), "state", STATE_DISABLED)
        self.cut_hosts.add(i)

    def heal(self, i: int) -> None:
        _run("bridge", "link", "set", "dev", self.veth(i), "state", STATE_FORWARDING)
        self.cut_hosts.discard(i)

    def port_state(self, i: int) -> str:
        doc = json.loads(_run("bridge", "-j", "link", "show", "dev", self.veth(i)).stdout or "[]")
        return doc[0].get("state", "?") if doc else "?"

    def pids(self, i: int) -> list[int]:
        """Every process whose network namespace is host i's."""
        p = _run("ip", "netns", "pids", self.ns(i), check=False)
        return [int(x) for x in p.stdout.split()] if p.returncode == 0 else []

    def kill_host_processes(self, i: int, sig: int = signal.SIGKILL) -> None:
        for pid in self.pids(i):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def close(self) -> None:
        """Kill our processes (by pid), delete our links and namespaces. Idempotent."""
        for p in self.procs:
            if p.poll() is None:
                try:
                    p.kill()
                except ProcessLookupError:
                    pass
        for ns in self.namespaces:
            i = int(ns.rsplit("h", 1)[1])
            for _ in range(3):      # children of killed supervisors die with them (PDEATHSIG) or here
                self.kill_host_processes(i)
                if not self.pids(i):
                    break
                time.sleep(0.2)
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                pass
        self.procs.clear()
        for link in reversed(self.links):
            _run("ip", "link", "del", link, check=False)
        self.links.clear()
        for ns in self.namespaces:
            _run("ip", "netns", "del", ns, check=False)
        self.namespaces.clear()
        self.cut_hosts.clear()

    def __enter__(self) -> "NetnsRig":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


def leftover_namespaces(run_id: str) -> list[str]:
    """Namespaces of run `run_id` still present (a check that close() cleaned up)."""
    out = _run("ip", "netns", "list", check=False).stdout.split("\n")
    return [line.split()[0] for line in out if line.startswith(f"kl{run_id}")]


# ---- a kraftlog cluster on the rig -------------------------------------------------------

HTTP_PORT, CONTROLLER_PORT, RAFT_PORT = 8082, 9093, 9193   # the same on every host (own namespaces)


class NodeExited(RuntimeError):
    """A node process of the rig's cluster exited (its log tail is in the message)."""


class NetnsKraftlogCluster:
    """One combined-mode node (controller + broker) per rig host, configured as on separate
    machines (docs/OPERATIONS.md): one TOML file per host, every node lists the same voters."""

    def __init__(self, rig: NetnsRig, base_dir: str, settings: Optional[dict] = None,
                 log_level: str = "INFO") -> None:
        self.rig = rig
        self.base_dir = base_dir
        self.settings = {"default_replication_factor": 3, "min_insync_replicas": 2, **(settings or {})}
        self.log_level = log_level
        self.procs: dict[int, subprocess.Popen] = {}
        self.password = secrets.token_hex(16)

    def url(self, i: int) -> str:
        return f"http://{self.rig.ip(i)}:{HTTP_PORT}"

    def controller_url(self, i: int) -> str:
        return f"http://{self.rig.ip(i)}:{CONTROLLER_PORT}"

    @property
    def urls(self) -> list[str]:
        return [self.url(i) for i in self.rig.hosts]

    def log_path(self, i: int) -> str:
        return os.path.join(self.base_dir, f"node-{i}.log")

    def config_path(self, i: int) -> str:
        return os.path.join(self.base_dir, f"node{i}.toml")

    def write_config(self, i: int) -> str:
        voters = ",".join(f"{j}@{self.rig.ip(j)}:{RAFT_PORT}:{CONTROLLER_PORT}" for j in self.rig.hosts)
        data = os.path.join(self.base_dir, f"node-{i}")
        lines = [f"node_id = {i}", 'cluster_id = "netns-rig"', 'http_host = "0.0.0.0"',
                 f'advertised_host = "{self.rig.ip(i)}"', f"http_port = {HTTP_PORT}",
                 f"controller_port = {CONTROLLER_PORT}", f"raft_port = {RAFT_PORT}",
                 f'controller_quorum_voters = "{voters}"', f'password = "{self.password}"',
                 f'data_dir = "{data}"', f'log_level = "{self.log_level}"']
        for k, v in self.settings.items():
            lines.append(f"{k} = {json.dumps(v)}")
        with open(self.config_path(i), "w") as f:
            f.write("\n".join(lines) + "\n")
        return self.config_path(i)

    def start_node(self, i: int) -> None:
        cmd = [sys.executable, "-m", "deploy.cli", "serve", "--config", self.write_config(i)]
        self.procs[i] = self.rig.spawn(i, cmd, log_path=self.log_path(i),
                                       env={"PYTHONPATH": ROOT, "PYTHONUNBUFFERED": "1"})

    def start(self, timeout: float = 120.0) -> "NetnsKraftlogCluster":
        os.makedirs(self.base_dir, exist_ok=True)
        for i in self.rig.hosts:
            self.start_node(i)
        self.wait_for(lambda: self._check_running() and all(http("GET", u + "/healthz", timeout=2)[0] == 200
                                                            for u in self.urls),
                      timeout, "every broker healthy")
        self.wait_for(lambda: self.active_controller() is not None, timeout, "an active controller")
        self.wait_for(self._all_unfenced, timeout, "every broker registered and unfenced")
        return self

    def _check_running(self) -> bool:
        for i, p in self.procs.items():
            if p.poll() is not None:
                with open(self.log_path(i), errors="replace") as f:
                    tail = "".join(f.readlines()[-15:])
                raise NodeExited(f"node {i} exited with code {p.returncode}; {self.log_path(i)} ends:\n{tail}")
        return True

    def _all_unfenced(self) -> bool:
        doc = self.controller_metadata()
        brokers = doc.get("brokers", []) if doc else []
        return len(brokers) == len(self.rig.hosts) and not any(b.get("fenced") for b in brokers)

    # ---- queries -----------------------------------------------------------------------

    @staticmethod
    def wait_for(pred: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = pred()
            except NodeExited:
                raise
            except Exception as e:  # noqa: BLE001 - transient while nodes start or move
                last = e
            if last and not isinstance(last, Exception):
                return last
            time.sleep(interval)
        raise AssertionError(f"timed out after {timeout} s waiting for {what} (last: {last!r})")

    def controller_status(self, i: int, timeout: float = 2.0) -> Optional[dict]:
        status, doc = http("GET", self.controller_url(i) + "/controller/v1/status", timeout=timeout)
        return doc if status == 200 else None

    def active_controller(self, exclude: tuple = ()) -> Optional[int]:
        """The node id of the active controller, asked of the hosts not in `exclude`."""
        for i in self.rig.hosts:
            if i in exclude or i in self.rig.cut_hosts:
                continue
            st = self.controller_status(i)
            if st and st.get("is_active"):
                return i
        return None

    def controller_metadata(self, exclude: tuple = ()) -> Optional[dict]:
        for i in self.rig.hosts:
            if i in exclude or i in self.rig.cut_hosts:
                continue
            status, doc = http("GET", self.controller_url(i) + "/controller/v1/metadata?require_active=true",
                               timeout=3)
            if status == 200:
                return doc
        return None

    def partitions(self, topic: str) -> list[dict]:
        doc = self.controller_metadata()
        if doc is None:
            raise RuntimeError("no active controller answered")
        t = next(t for t in doc["topics"] if t["name"] == topic)
        return t["partitions"]

    def create_topic(self, name: str, partitions: int, replication_factor: int = 3,
                     configs: Optional[dict] = None, timeout: float = 60.0) -> None:
        status, doc = http("POST", self.urls[0] + "/v1/topics", {
            "name": name, "partitions": partitions, "replication_factor": replication_factor,
            "configs": configs or {}}, timeout=30)
        if status != 201:
            raise RuntimeError(f"create topic {name}: {status} {doc}")
        self.wait_for(lambda: all(len(p["isr"]) == replication_factor for p in self.partitions(name)),
                      timeout, f"{name} fully in sync")

    def close(self) -> None:
        """Kill the nodes (by pid, via the rig); the rig deletes the namespaces."""
        for i, p in self.procs.items():
            if p.poll() is None:
                p.kill()
            self.rig.kill_host_processes(i)
        for p in self.procs.values():
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                pass
        self.procs.clear()
