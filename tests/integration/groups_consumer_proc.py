"""A group consumer as its own process (for kill -9 tests). Prints JSON lines on stdout:
{"assignment": [[topic, p], ...]} whenever its assignment changes, {"r": [p, offset]} per record.

    python groups_consumer_proc.py URLS GROUP TOPIC SESSION_TIMEOUT_MS
SIGTERM closes the consumer (final commit, leave the group)."""
import asyncio
import json
import signal
import sys

from http_api.client import Consumer


async def main(urls: str, group: str, topic: str, session_ms: int) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with Consumer(urls, group_id=group, auto_offset_reset="earliest", session_timeout_ms=session_ms,
                        auto_commit_interval_ms=100, max_wait_ms=100) as c:
        await c.subscribe([topic])
        last = None
        while not stop.is_set():
            records = await c.poll(100)
            a = sorted(c.assignment())
            if a != last:
                last = a
                print(json.dumps({"assignment": a}), flush=True)
            for r in records:
                print(json.dumps({"r": [r.partition, r.offset]}), flush=True)
    print(json.dumps({"closed": True}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
