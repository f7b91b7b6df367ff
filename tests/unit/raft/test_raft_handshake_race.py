"""raft/frame_guard.py's handshake guard (issue 24): with a password, pysyncobj marks an
outgoing connection CONNECTED before the peer's random key has arrived; a raft message sent
in that round trip (RequestVote, pre-vote, our pings: they do not wait for the handshake)
went out unkeyed, the peer failed it as an authentication failure and dropped the link,
which was redialled only 0.5 s later. Two real SyncObjs over loopback, ticked by the test:
a message sent at the worst moment must not cost the link."""
from pysyncobj import SyncObj, SyncObjConf
from pysyncobj.tcp_connection import CONNECTION_STATE

from raft.frame_guard import install_frame_guard, key_exchange_pending
from raft.log import RaftPeerStats
from tests.rigs.controllers import free_port


class _Conn:
    def __init__(self, encryptor, key):
        self.encryptor, self.sendRandKey = encryptor, key


def test_key_exchange_pending_only_while_an_encrypting_connection_lacks_the_peer_key():
    assert key_exchange_pending(_Conn(object(), None))
    assert not key_exchange_pending(_Conn(object(), b"k" * 32))
    assert not key_exchange_pending(_Conn(None, None))        # no password: nothing to wait for


def _tick(*nodes, rounds: int = 1) -> None:
    for _ in range(rounds):
        for so in nodes:
            so._onTick(0.005)


def test_a_message_sent_before_the_peer_key_arrives_does_not_break_the_link():
    low, high = sorted(f"127.0.0.1:{free_port()}" for _ in range(2))   # `high` dials `low`
    conf = dict(password="secret", autoTick=False, dynamicMembershipChange=True, raftMinTimeout=30,
                raftMaxTimeout=31, connectionTimeout=60, connectionRetryTime=0.05)
    acceptor = SyncObj(low, [high], conf=SyncObjConf(**conf))
    dialler = SyncObj(high, [low], conf=SyncObjConf(**conf))
    try:
        stats = {n: RaftPeerStats() for n in ("acceptor", "dialler")}
        assert install_frame_guard(acceptor, 1 << 20, stats["acceptor"])
        assert install_frame_guard(dialler, 1 << 20, stats["dialler"])
        transport = dialler._SyncObj__transport
        (peer, conn), = transport._connections.items()
        # the dialler alone ticks: TCP connects (the kernel accepts), it sends its key and is
        # CONNECTED, while the acceptor has not answered with its own key yet
        for _ in range(400):
            _tick(dialler)
            if conn.state == CONNECTION_STATE.CONNECTED:
                break
        assert conn.state == CONNECTION_STATE.CONNECTED and key_exchange_pending(conn)
        # what a tick in this window does (a ping, a vote request): held back, not sent unkeyed
        sent_early = transport.send(peer, {"type": "kraftlog_ping"})
        for _ in range(400):
            _tick(acceptor, dialler)
            if not key_exchange_pending(conn) and len(acceptor._SyncObj__connectedNodes) == 1:
                break
        assert stats["acceptor"].auth_failures == 0, "the early message failed authentication at the peer"
        assert not key_exchange_pending(conn), "the key exchange did not finish"
        _tick(acceptor, dialler, rounds=50)
        assert stats["acceptor"].auth_failures == 0
        assert conn.state == CONNECTION_STATE.CONNECTED and len(acceptor._SyncObj__connectedNodes) == 1
        assert transport.send(peer, {"type": "kraftlog_ping"})      # keyed now: delivered, link kept
        _tick(acceptor, dialler, rounds=20)
        assert stats["acceptor"].auth_failures == 0 and conn.state == CONNECTION_STATE.CONNECTED
        assert sent_early is False    # it was held back (reported unsent, like a dead link)
    finally:
        dialler.destroy()
        acceptor.destroy()



def test_a_handshake_the_peer_never_answers_is_timed_out_and_redialled():
    # a peer that accepts but never answers (paused, or cut off behind a proxy): pysyncobj
    # times a connection out only when something is sent on it, so holding every message
    # back must still time the connection out, or the link stays down for ever
    import socket
    import time

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    silent = f"127.0.0.1:{listener.getsockname()[1]}"
    me = f"127.0.0.2:{free_port()}"   # sorts above `silent`: pysyncobj dials peers whose address sorts below
    dialler = SyncObj(me, [silent], conf=SyncObjConf(password="secret", autoTick=False, dynamicMembershipChange=True,
                                                     appendEntriesPeriod=0.01, raftMinTimeout=0.1, raftMaxTimeout=0.2,
                                                     connectionTimeout=0.5, connectionRetryTime=0.1))
    accepted = []
    try:
        assert install_frame_guard(dialler, 1 << 20, RaftPeerStats())
        transport = dialler._SyncObj__transport
        (peer, conn), = transport._connections.items()
        deadline = time.monotonic() + 15
        while len(accepted) < 2 and time.monotonic() < deadline:
            _tick(dialler)
            transport.send(peer, {"type": "kraftlog_ping"})   # what the adapter's ping does every 0.5 s
            try:
                accepted.append(listener.accept()[0])
            except BlockingIOError:
                pass
        assert len(accepted) >= 2, "the unanswered handshake was never timed out and redialled"
    finally:
        dialler.destroy()
        for s in accepted:
            s.close()
        listener.close()
