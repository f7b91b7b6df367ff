"""`invariant(cond, msg, *args)`: a check of kraftlog's own state that survives `python -O`.

`assert` statements vanish under `-O`; the storage ladder's invariants (offsets increase,
`log_start_offset <= high_watermark <= log_end_offset`, indexes monotonic, recovery point
<= log end) must hold in production too, so they are checked with `invariant`, which raises
`InvariantViolation` whatever the interpreter flags. A violation is a bug in kraftlog, never
a client error: nothing on the request path catches it. The message is %-formatted with
`args` only when the check fails. On a path that runs per append, where even evaluating the
arguments counts, write the same check inline: `if not cond: raise InvariantViolation(...)`.
Imports nothing of the project (any package may use it).
"""
from __future__ import annotations


class InvariantViolation(AssertionError):
    """An internal invariant does not hold: kraftlog has a bug (report it with the message)."""


def invariant(cond: object, msg: str, *args: object) -> None:
    """Raise InvariantViolation(msg % args) unless `cond` is true (also under `python -O`)."""
    if not cond:
        raise InvariantViolation(msg % args if args else msg)


__all__ = ["InvariantViolation", "invariant"]
