"""Async tests here run on both event loops: brokers run uvloop, whose BufferedProtocol
reads differ from asyncio's (it reads again at once when a read filled its buffer)."""
from __future__ import annotations

import asyncio

import uvloop


def pytest_asyncio_loop_factories(config, item):
    return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
