"""raft/frame_guard.py on a real SyncObj's transport (no peer needed): every outgoing
connection, one added later and every accepted one become GuardedTcpConnections; the
guard refuses an announced length over the cap before buffering it."""
import struct

from pysyncobj import SyncObj, SyncObjConf
from pysyncobj.tcp_connection import TcpConnection

from raft.frame_guard import GuardedTcpConnection, install_frame_guard
from raft.log import RaftPeerStats
from tests.rigs.controllers import free_port


def test_every_connection_of_a_syncobj_is_guarded():
    # pysyncobj dials only peers whose address sorts below its own
    later, peer, me = sorted(f"127.0.0.1:{free_port()}" for _ in range(3))
    so = SyncObj(me, [peer], conf=SyncObjConf(password="x", autoTick=False, dynamicMembershipChange=True))
    try:
        stats = RaftPeerStats()
        assert install_frame_guard(so, 1024, stats)
        transport = so._SyncObj__transport
        assert len(transport._connections) == 1
        assert all(type(c) is GuardedTcpConnection for c in transport._connections.values())
        from pysyncobj.node import TCPNode
        node = TCPNode(later)
        transport.addNode(node)
        assert type(transport._connections[node]) is GuardedTcpConnection
        conn = TcpConnection(so._poller)
        transport._server._TcpServer__onNewConnectionCallback(conn)
        assert type(conn) is GuardedTcpConnection and conn._frame_max_bytes == 1024
        # an announced frame over the cap: rejected (and counted) before any body is buffered
        conn._TcpConnection__readBuffer = struct.pack("i", 1025)
        assert conn._TcpConnection__processParseMessage() is None
        assert stats.frames_too_large == 1
        conn2 = TcpConnection(so._poller)
        transport._server._TcpServer__onNewConnectionCallback(conn2)
        conn2._TcpConnection__readBuffer = struct.pack("i", 1024) + b"\0" * 10
        assert conn2._TcpConnection__processParseMessage() is None   # incomplete: wait, nothing counted
        assert stats.frames_too_large == 1 and stats.auth_failures == 0
    finally:
        so.destroy()
