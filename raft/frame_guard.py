"""Frame guard for pysyncobj 0.3.17's raft port.

pysyncobj frames every message as a 4-byte native length then the (Fernet-encrypted,
zlib-compressed) pickle, and buffers whatever a peer sends until the announced length has
arrived: there is no size cap, so one connection announcing 2 GiB grows a buffer (with a
quadratic copy) until the process runs out of memory. A frame that fails the password's
MAC check is dropped silently, so nobody sees a peer with the wrong password.

`install_frame_guard(syncobj, frame_max_bytes, stats)` turns every connection of one
SyncObj (its outgoing connections, now and for voters added later, and each incoming
connection as it is accepted) into a
`GuardedTcpConnection`, which:
- reads no more once a whole frame of the largest allowed size is buffered (memory per
  connection stays below `frame_max_bytes` + 4 + one recv);
- drops the connection as soon as a frame header announces more than `frame_max_bytes` (or
  a negative length), before buffering its body: `stats.frames_too_large` + 1;
- counts a complete frame that fails to authenticate or decode (wrong password, replay,
  corruption) before dropping the connection as pysyncobj does: `stats.auth_failures` + 1;
- logs both, at most once a second per kind per SyncObj.

It also closes a reconnect race of pysyncobj's handshake (issue 24: raft frames failing
authentication on live links, the link dropped and redialled 0.5 s later, elections lost
meanwhile). With a password, an outgoing connection is CONNECTED as soon as TCP connects and
it has sent its random key, but the peer's key arrives one round trip later; a message sent
in between (`transport.send` only checks CONNECTED) goes out without the peer's key, the
peer fails to unwrap it and drops the connection. pysyncobj's own AppendEntries wait for the
handshake (they go to connected nodes only), but RequestVote, pre-vote and our pings do not.
The guarded `transport.send` answers False (not sent, as for a dead link) until the key
exchange of that connection is complete (`key_exchange_pending`), and still checks the
connection's timeout as a send does: a handshake the peer never answers is dropped and
redialled after `connectionTimeout`, as before.

Legitimate frames are small: pysyncobj splits snapshots, and an entry sent alone, into
appendEntriesBatchSizeBytes (64 KiB) parts; a large entry sent after smaller ones goes whole
(a CreateTopics of request_max_partitions is ~1.7 MB, fencing a broker ~1 MB per 10,000 of
its partitions; raft/README.md "Large entries"), so the default cap (16 MiB) is far above them.
It relies on pysyncobj's private TcpConnection members (name-mangled `_TcpConnection__*`);
`install_frame_guard` returns False and changes nothing when they are missing.
"""
from __future__ import annotations

import struct

from pysyncobj.tcp_connection import CONNECTION_STATE, TcpConnection

from raft.log import RAFT_FRAME_MAX_BYTES_DEFAULT, RaftPeerStats

_HEADER = struct.Struct("i")   # pysyncobj's framing: native signed int length
_REQUIRED = ("_TcpConnection__processRead", "_TcpConnection__processParseMessage")   # methods replaced


class GuardedTcpConnection(TcpConnection):
    """pysyncobj's TcpConnection with the frame cap and the counted authentication failures
    of the module docstring. Set by install_frame_guard: `_frame_max_bytes`, `_frame_stats`."""

    _frame_max_bytes: int = RAFT_FRAME_MAX_BYTES_DEFAULT
    _frame_stats: RaftPeerStats

    def _peer(self) -> str:
        sock = self._TcpConnection__socket
        try:
            host, port = sock.getpeername()[:2]
            return f"{host}:{port}"
        except Exception:  # noqa: BLE001 - closed or not connected
            return "?"

    def _announced(self) -> int | None:
        buf = self._TcpConnection__readBuffer
        return _HEADER.unpack_from(buf)[0] if len(buf) >= _HEADER.size else None

    def _reject_oversized(self) -> bool:
        """Drop the connection when the buffered frame header announces too much."""
        n = self._announced()
        if n is None or 0 <= n <= self._frame_max_bytes:
            return False
        self._frame_stats.count("frames_too_large", "raft peer %s announced a frame of %d bytes "
                                "(raft_frame_max_bytes=%d): connection dropped", self._peer(), n,
                                self._frame_max_bytes)
        self.disconnect()
        return True

    def _TcpConnection__processRead(self) -> bool:
        if len(self._TcpConnection__readBuffer) >= _HEADER.size + self._frame_max_bytes:
            return False   # a whole frame is buffered: parse it before reading more
        more = TcpConnection._TcpConnection__processRead(self)
        if self.state == CONNECTION_STATE.DISCONNECTED:
            return False
        return False if self._reject_oversized() else more

    def _TcpConnection__processParseMessage(self):
        if self._reject_oversized():
            return None
        n = self._announced()
        complete = n is not None and len(self._TcpConnection__readBuffer) - _HEADER.size >= n
        peer = self._peer() if complete else None
        message = TcpConnection._TcpConnection__processParseMessage(self)
        if message is None and complete:   # pysyncobj failed it (MAC, timestamp, decoding) and disconnected
            self._frame_stats.count("auth_failures", "raft peer %s sent a frame that failed authentication "
                                    "(wrong password, replayed or corrupt): connection dropped", peer)
        return message


def key_exchange_pending(conn) -> bool:
    """True while `conn` (pysyncobj TcpConnection) encrypts but has not received the peer's
    random key: a message sent now would go out unkeyed and the peer would drop the link."""
    return getattr(conn, "encryptor", None) is not None and not getattr(conn, "sendRandKey", None)


def guard_connection(conn: TcpConnection, frame_max_bytes: int, stats: RaftPeerStats) -> None:
    """Make `conn` a GuardedTcpConnection (same state; checks from its next read on)."""
    if type(conn) is TcpConnection:
        conn.__class__ = GuardedTcpConnection
    conn._frame_max_bytes = frame_max_bytes
    conn._frame_stats = stats


def install_frame_guard(syncobj, frame_max_bytes: int, stats: RaftPeerStats) -> bool:
    """Guard every raft connection of `syncobj` (see the module docstring). False, and
    nothing changed, when pysyncobj's internals are not the expected ones."""
    if frame_max_bytes < 1:
        raise ValueError(f"raft_frame_max_bytes must be >= 1, got {frame_max_bytes}")
    transport = getattr(syncobj, "_SyncObj__transport", None)
    server = getattr(transport, "_server", None)
    connections = getattr(transport, "_connections", None)
    if (server is None or not isinstance(connections, dict)
            or not hasattr(server, "_TcpServer__onNewConnectionCallback")
            or not all(hasattr(TcpConnection, n) for n in _REQUIRED)):
        return False
    for conn in list(connections.values()):
        guard_connection(conn, frame_max_bytes, stats)
    accepted = server._TcpServer__onNewConnectionCallback

    def on_new_connection(conn):
        guard_connection(conn, frame_max_bytes, stats)
        accepted(conn)

    server._TcpServer__onNewConnectionCallback = on_new_connection
    add_node = transport.addNode

    def guarded_add_node(node):   # a voter added at run time (dynamic membership): its outgoing connection
        add_node(node)
        conn = connections.get(node)
        if conn is not None:
            guard_connection(conn, frame_max_bytes, stats)

    transport.addNode = guarded_add_node
    send = transport.send

    def send_after_key_exchange(node, message):   # see the module docstring (handshake race)
        conn = connections.get(node)
        if conn is not None and key_exchange_pending(conn):
            # not sent, but timed out like a send would: pysyncobj checks connectionTimeout
            # only when it sends or the socket has an event, so a handshake the peer never
            # answers (a paused or cut-off peer) would otherwise hold the link down for ever
            conn._TcpConnection__trySendBuffer()
            return False
        return send(node, message)

    transport.send = send_after_key_exchange
    return True
