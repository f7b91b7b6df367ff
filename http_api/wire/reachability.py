"""Is anybody listening at a URL's host and port? One TCP connect, for the callers that
must tell a dead process (refused) from a slow one (the connect times out or succeeds): the
controller's probe of a broker reported unreachable, the broker's forward of a produce to a
leader that refused before."""
from __future__ import annotations

import asyncio
from typing import Optional
from urllib.parse import urlsplit


async def connection_refused(url: Optional[str], timeout_s: float) -> bool:
    """True when a TCP connection to the host:port of `url` is refused (nobody listens);
    False when it connects or only times out (the process may be alive but slow)."""
    if not url:
        return False
    u = urlsplit(url)
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(u.hostname, u.port or 80), timeout_s)
    except (ConnectionRefusedError, ConnectionResetError):
        return True
    except (asyncio.TimeoutError, OSError):
        return False
    writer.close()
    return False
