"""A history of client operations, Jepsen style: every operation is an `invoke` event
followed by exactly one completion event:

- `ok`   the operation certainly happened (with its result: offsets, records, ...);
- `fail` the operation certainly did not happen (a 4xx the broker answered before storing,
         e.g. NOT_LEADER_OR_FOLLOWER on the partition route, NOT_ENOUGH_REPLICAS);
- `info` the outcome is unknown (timeouts, 5xx, connection errors): a write may or may not
         appear later.

Operation kinds (`f`) and their fields:

- `produce`  value: {"topic", "partition", "values": [str], "idempotent": bool}
             ok result: {"offsets": [int]} (one per value, request order)
- `fetch`    value: {"topic", "partition", "offset", "final": bool}
             ok result: {"records": [[offset, value], ...], "high_watermark": int}
             `final` marks the read-everything pass done after the faults healed.
- `commit`   value: {"group", "topic", "partition", "offset"}
- `read_committed` value: {"group", "topic", "partition"}; ok result: {"offset": int or None}
- `txn`      value: {"txid", "records": [[topic, partition, value], ...], "intent": "commit"|"abort",
             "txn": true}; ok result: {"committed": bool, "offsets": [[topic, partition, offset]]};
             `fail` = no commit was ever sent (certainly not committed); `info` = commit unknown
- `fetch` with "txn": true (and "isolation_level": "read_committed") reads a transactional
             topic; ok result adds "next_offset" and "last_stable_offset"

Events are plain dicts so a history is saved as JSON lines and replayed into the checker.
The history is not thread-safe: record from one thread (one asyncio loop).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

INVOKE, OK, FAIL, INFO = "invoke", "ok", "fail", "info"
COMPLETIONS = (OK, FAIL, INFO)


@dataclass
class Op:
    """One operation: its invocation and (once known) its completion."""

    id: int
    process: str
    f: str
    value: dict
    invoke_index: int
    invoke_time: float
    type: Optional[str] = None          # ok / fail / info, None while pending
    result: dict = field(default_factory=dict)
    complete_index: int = -1
    complete_time: float = -1.0
    error: Optional[str] = None

    @property
    def key(self) -> tuple[str, int]:
        return self.value.get("topic"), self.value.get("partition")

    def brief(self) -> dict:
        """A short description of the operation for anomaly reports."""
        out = {"op": self.id, "process": self.process, "f": self.f, "type": self.type or "pending",
               "invoke_time": round(self.invoke_time, 3)}
        v = dict(self.value)
        if "values" in v and len(v["values"]) > 6:
            v["values"] = v["values"][:3] + ["..."] + v["values"][-2:]
        out["value"] = v
        if self.result:
            r = dict(self.result)
            if "records" in r and len(r["records"]) > 6:
                r["records"] = r["records"][:3] + ["..."] + r["records"][-2:]
            if "offsets" in r and len(r["offsets"]) > 6:
                r["offsets"] = r["offsets"][:3] + ["..."] + r["offsets"][-2:]
            out["result"] = r
        if self.error:
            out["error"] = self.error
        return out


class History:
    """Appends invoke/complete events; `ops` gives the operations paired up."""

    def __init__(self, clock=time.monotonic):
        self.events: list[dict] = []
        self.ops: list[Op] = []
        self._clock = clock
        self.t0 = clock()

    def now(self) -> float:
        return self._clock() - self.t0

    def invoke(self, process: str, f: str, **value: Any) -> Op:
        op = Op(id=len(self.ops), process=process, f=f, value=value, invoke_index=len(self.events),
                invoke_time=self.now())
        self.ops.append(op)
        self.events.append({"type": INVOKE, "op": op.id, "process": process, "f": f, "value": value,
                            "time": op.invoke_time})
        return op

    def complete(self, op: Op, type_: str, error: Optional[str] = None, **result: Any) -> Op:
        assert type_ in COMPLETIONS, type_
        assert op.type is None, f"op {op.id} completed twice"
        op.type, op.result, op.error = type_, result, error
        op.complete_index, op.complete_time = len(self.events), self.now()
        ev = {"type": type_, "op": op.id, "time": op.complete_time, "result": result}
        if error:
            ev["error"] = error
        self.events.append(ev)
        return op

    def ok(self, op: Op, **result: Any) -> Op:
        return self.complete(op, OK, **result)

    def fail(self, op: Op, error: str, **result: Any) -> Op:
        return self.complete(op, FAIL, error=error, **result)

    def info(self, op: Op, error: str, **result: Any) -> Op:
        return self.complete(op, INFO, error=error, **result)

    # ---- persistence ----------------------------------------------------------------------

    def dump(self, path: str) -> None:
        with open(path, "w") as f:
            for ev in self.events:
                f.write(json.dumps(ev) + "\n")

    @classmethod
    def from_events(cls, events: Iterable[dict]) -> "History":
        h = cls(clock=lambda: 0.0)
        for ev in events:
            if ev["type"] == INVOKE:
                op = Op(id=ev["op"], process=ev["process"], f=ev["f"], value=ev["value"],
                        invoke_index=len(h.events), invoke_time=ev.get("time", 0.0))
                assert op.id == len(h.ops), "events must list invocations in op id order"
                h.ops.append(op)
            else:
                op = h.ops[ev["op"]]
                op.type, op.result, op.error = ev["type"], ev.get("result") or {}, ev.get("error")
                op.complete_index, op.complete_time = len(h.events), ev.get("time", 0.0)
            h.events.append(ev)
        return h

    @classmethod
    def load(cls, path: str) -> "History":
        with open(path) as f:
            return cls.from_events(json.loads(line) for line in f if line.strip())
