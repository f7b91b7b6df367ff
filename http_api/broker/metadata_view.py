"""The broker's current view of cluster metadata, with a way to await changes.

Job: hold the latest `MetadataImage` the broker has applied, apply each new image to the
ReplicaManager *before* publishing it (so a request that sees a partition in the image
also finds its local replica), and let handlers wait — on futures, not sleeps — until a
condition holds (a topic just created by the controller becomes visible, ...).

Security (users, bearer tokens, ACLs, kept in the metadata quorum): `view.security` is the
current `SecurityImage` (metadata_quorum/security/image.py; immutable, its `version` changes
on every change), `view.add_security_listener(fn)` calls `fn(security_image)` after every
update that changed it. A change reaches every broker's view with the metadata feed's long
poll (milliseconds; the test asserts < 1 s on 3 brokers).
"""
from __future__ import annotations

import asyncio
import copy
from typing import Any, Callable

from metadata_quorum.security.image import SecurityImage

_NO_SECURITY = SecurityImage()


class MetadataView:
    """Latest applied MetadataImage (`image`) plus `wait_until(predicate, timeout_s)`."""

    def __init__(self, replica_manager: Any, image: Any = None) -> None:
        self.replica_manager = replica_manager
        self.image = image
        self.version = 0
        self._waiters: list[asyncio.Future] = []
        self._listeners: list[Callable[[Any], None]] = []
        self._security_listeners: list[Callable[[SecurityImage], None]] = []
        self._lock = asyncio.Lock()

    def add_listener(self, fn: Callable[[Any], None]) -> None:
        self._listeners.append(fn)

    @property
    def security(self) -> SecurityImage:
        """Users, tokens and ACLs of the current image (empty before metadata is loaded)."""
        return self.image.security if self.image is not None else _NO_SECURITY

    def add_security_listener(self, fn: Callable[[SecurityImage], None]) -> None:
        """`fn(security_image)` after each update whose SecurityImage changed (version differs)."""
        self._security_listeners.append(fn)

    async def update(self, image: Any) -> None:
        """Apply a snapshot of `image` to the replica manager, publish it, wake waiters.

        The metadata follower replays records into its image in place, so we copy it:
        handlers must never see a partition the replica manager has not applied yet.
        """
        image = copy.deepcopy(image)
        async with self._lock:
            await self.replica_manager.apply_metadata(image)
            old_security = self.security
            self.image = image
            self.version += 1
            for fn in self._listeners:
                fn(image)
            if image.security.version != old_security.version:
                for sfn in self._security_listeners:
                    sfn(image.security)
            waiters, self._waiters = self._waiters, []
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)

    async def wait_until(self, predicate: Callable[[Any], bool], timeout_s: float) -> bool:
        """True once predicate(image) holds; False if it still does not after timeout_s."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            if self.image is not None and predicate(self.image):
                return True
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            fut = loop.create_future()
            self._waiters.append(fut)
            try:
                await asyncio.wait_for(fut, remaining)
            except asyncio.TimeoutError:
                pass
