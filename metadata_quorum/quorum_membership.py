"""Controller quorum membership: the pure decisions (no IO; the shell is quorum_routes.py).

pysyncobj changes the voter set one server at a time and knows a voter only by its raft
address; its membership entries never reach `apply` (DESIGN.md section 10). So the metadata
state machine keeps its own replicated record of the controllers, plain data:

    controllers: {node_id: {"id", "raft_address", "url", "incarnation", "state"}}
        state: "voter" | "adding" | "removing" | "removed"
    change: None | {"op": "add" | "remove", "id", "epoch"}   (the one change in flight)

An incarnation id is made by a controller when its data directory is empty and kept there
(`controller.identity`); a controller whose incarnation is not the registered one of its id
(a wiped disk at the same address would vote with an empty log) is refused and exits.

A change is a sequence of quorum entries around pysyncobj's own membership entry:
    add:    begin_add (registration, state adding) -> raft add -> new voter catches up -> end_add
    remove: begin_remove (state removing) -> raft remove -> end_remove (state removed)
    abort undoes a begin_* whose raft change did not happen; a new active controller
    finishes or aborts a change left by its predecessor from the raft voter set (`reconcile`).
`register` (any epoch, sent by every controller for itself) records the controllers the
quorum was born with.
"""
from __future__ import annotations

import re
from typing import Any, Optional

from partitions.errors import ErrorCode, KraftlogError

STATES = ("voter", "adding", "removing", "removed")
_ADDRESS = re.compile(r"^[A-Za-z0-9.\-\[\]:]+:\d{1,5}$")


def registration(node_id: Any, raft_address: Any, url: Any, incarnation: Any, state: str = "voter") -> dict:
    """A validated controller registration (INVALID_REQUEST saying what is wrong)."""
    if isinstance(node_id, bool) or not isinstance(node_id, int) or node_id < 0:
        raise KraftlogError(ErrorCode.INVALID_REQUEST, f"id must be a controller node id (an integer >= 0), got {node_id!r}")
    if not isinstance(raft_address, str) or not _ADDRESS.match(raft_address):
        raise KraftlogError(ErrorCode.INVALID_REQUEST, f"raft_address must be HOST:PORT, got {raft_address!r}")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise KraftlogError(ErrorCode.INVALID_REQUEST, f"url must be the controller's http(s):// URL, got {url!r}")
    if not isinstance(incarnation, str) or not 8 <= len(incarnation) <= 64:
        raise KraftlogError(ErrorCode.INVALID_REQUEST,
                            "incarnation must be the controller's incarnation id (GET /controller/v1/quorum/identity "
                            f"on it), got {incarnation!r}")
    return {"id": node_id, "raft_address": raft_address, "url": url.rstrip("/"), "incarnation": incarnation,
            "state": state}


def registration_from_body(body: dict) -> dict:
    unknown = set(body) - {"id", "raft_address", "url", "incarnation", "request_id"}
    if unknown:
        raise KraftlogError(ErrorCode.INVALID_REQUEST,
                            f"unknown field(s) {sorted(map(str, unknown))}; allowed: id, raft_address, url, incarnation")
    return registration(body.get("id"), body.get("raft_address"), body.get("url"), body.get("incarnation"), "adding")


def _in_progress(change: dict) -> KraftlogError:
    what = "adding" if change["op"] == "add" else "removing"
    return KraftlogError(ErrorCode.POLICY_VIOLATION,
                         f"another controller quorum change ({what} controller {change['id']}) is not finished; "
                         "one change at a time: wait for it (kraftlog quorum describe) and retry",
                         reason="voter_change_in_progress", pending_change=dict(change))


def voter_ids(controllers: dict, voter_addresses: list, config_voters: dict) -> dict:
    """{raft address: node id} of the current voters: registrations first, then the static
    configuration (`config_voters`: {node id: raft address}); None for an unknown address."""
    by_addr = {a: nid for nid, a in config_voters.items()}
    for c in controllers.values():
        if c["state"] != "removed":
            by_addr[c["raft_address"]] = c["id"]
    return {a: by_addr.get(a) for a in voter_addresses}


# ---------------------------------------------------------------------- decisions (active controller)
def decide_add(controllers: dict, change: Optional[dict], voter_addresses: list, config_voters: dict,
               reg: dict) -> None:
    """Raise the error refusing to add `reg`, or return (the add may start)."""
    if change is not None:
        raise _in_progress(change)
    ids = voter_ids(controllers, voter_addresses, config_voters)
    if reg["id"] in ids.values():
        raise KraftlogError(ErrorCode.DUPLICATE_VOTER, f"controller {reg['id']} is a voter already; "
                            "give the new controller an unused node id")
    if reg["raft_address"] in ids:
        raise KraftlogError(ErrorCode.DUPLICATE_VOTER,
                            f"raft address {reg['raft_address']} belongs to voter {ids[reg['raft_address']]}; "
                            "remove that voter first (kraftlog quorum remove-controller) or use another address")
    old = controllers.get(reg["id"])
    if old is not None and old["state"] == "removed" and old["incarnation"] == reg["incarnation"]:
        raise KraftlogError(ErrorCode.INVALID_VOTER_KEY,
                            f"controller {reg['id']} was removed with this incarnation ({reg['incarnation']}): its "
                            "log stopped at the removal; start it on an empty data directory to add it again")


def decide_remove(controllers: dict, change: Optional[dict], voter_addresses: list, config_voters: dict,
                  node_id: int, self_id: int) -> str:
    """The raft address of the voter `node_id` to remove, or the error refusing it. The caller
    handles node_id == self_id (transfer leadership first)."""
    if change is not None:
        raise _in_progress(change)
    ids = voter_ids(controllers, voter_addresses, config_voters)
    addr = next((a for a, nid in ids.items() if nid == node_id), None)
    if addr is None:
        raise KraftlogError(ErrorCode.VOTER_NOT_FOUND, f"controller {node_id} is not a voter; voters: "
                            f"{sorted(n for n in ids.values() if n is not None)} (kraftlog quorum describe)")
    if len(ids) <= 1:
        raise KraftlogError(ErrorCode.POLICY_VIOLATION,
                            f"controller {node_id} is the last voter: the quorum needs at least one; "
                            "add another controller first (kraftlog cluster add-controller)",
                            reason="last_voter")
    return addr


def reconcile(change: Optional[dict], controllers: dict, voter_addresses: list, epoch: int) -> Optional[dict]:
    """The quorum op that ends a change a previous active controller left in flight (its
    epoch is older than `epoch`): finished when the raft voter set shows it, else aborted."""
    if change is None or change.get("epoch") == epoch:
        return None
    reg = controllers.get(change["id"])
    in_raft = reg is not None and reg["raft_address"] in voter_addresses
    if change["op"] == "add":
        return {"op": "end_add" if in_raft else "abort", "id": change["id"]}
    return {"op": "abort" if in_raft else "end_remove", "id": change["id"]}


def own_registration_problem(controllers: dict, node_id: int, incarnation: str) -> Optional[str]:
    """Why this controller must stop, or None: its id is registered with another incarnation
    (its data directory was wiped or copied), or it was removed from the quorum."""
    reg = controllers.get(node_id)
    if reg is None or reg["incarnation"] is None:
        return None
    if reg["incarnation"] != incarnation and reg["state"] != "removed":
        return (f"controller {node_id} is registered with incarnation {reg['incarnation']} but this data directory "
                f"holds {incarnation}: its raft log was lost or replaced, and voting with it could undo committed "
                f"metadata. Remove the voter (kraftlog quorum remove-controller {node_id}) and add this node again "
                "as a new controller (kraftlog quorum add-controller)")
    if reg["state"] == "removed" and reg["incarnation"] == incarnation:
        return f"controller {node_id} was removed from the metadata quorum; it stops (add it again to reuse it)"
    return None


# ---------------------------------------------------------------------- the replicated state
def apply_op(controllers: dict, change: Optional[dict], op: dict, epoch_current: bool, epoch: int) -> tuple:
    """Apply one quorum op deterministically -> (change after, result). `controllers` is
    updated in place; never raises for a well-formed op (a bad one is a result)."""
    kind = op.get("op")
    nid = op.get("id")
    if kind == "register":
        reg = op["registration"]
        old = controllers.get(reg["id"])
        if old is None:
            controllers[reg["id"]] = dict(reg, state="voter")
            return change, {"ok": True}
        if old["incarnation"] != reg["incarnation"]:
            return change, {"ok": False, "conflict": True, "reason": "incarnation", "registered": old["incarnation"]}
        if old["state"] == "removed":
            return change, {"ok": False, "removed": True}
        return change, {"ok": True, "noop": True}
    if kind == "noop":
        return change, {"ok": True}
    if not epoch_current:
        return change, {"ok": False, "stale_epoch": True}
    if kind == "begin_add":
        if change is not None:
            return change, {"ok": False, "in_flight": dict(change)}
        reg = op["registration"]
        controllers[reg["id"]] = dict(reg, state="adding")
        return {"op": "add", "id": reg["id"], "epoch": epoch}, {"ok": True}
    if kind == "begin_remove":
        if change is not None:
            return change, {"ok": False, "in_flight": dict(change)}
        if nid not in controllers:   # a voter of the initial configuration that never registered
            controllers[nid] = {"id": nid, "raft_address": op.get("raft_address"), "url": None, "incarnation": None,
                                "state": "voter"}
        controllers[nid]["state"] = "removing"
        return {"op": "remove", "id": nid, "epoch": epoch}, {"ok": True}
    if change is None or change["id"] != nid:
        return change, {"ok": False, "reason": "no such change in flight"}
    if kind == "end_add" and change["op"] == "add":
        controllers[nid]["state"] = "voter"
    elif kind == "end_remove" and change["op"] == "remove":
        controllers[nid]["state"] = "removed"
    elif kind == "abort":
        if change["op"] == "add":
            controllers.pop(nid, None)
        else:
            controllers[nid]["state"] = "voter"
    else:
        return change, {"ok": False, "reason": f"op {kind} does not end a {change['op']}"}
    return None, {"ok": True}


def describe(controllers: dict, change: Optional[dict], voter_addresses: list, config_voters: dict,
             leader_id: Optional[int], match_indexes: dict, commit_index: int) -> dict:
    """`kraftlog quorum describe`: {"leader_id", "voters": [{"id", "address", "lag", ...}]}.
    `lag` = entries the voter is behind the leader's commit index (None when this node is not
    the leader and cannot know)."""
    ids = voter_ids(controllers, voter_addresses, config_voters)
    voters = []
    for addr in voter_addresses:
        nid = ids[addr]
        reg = controllers.get(nid) if nid is not None else None
        match = match_indexes.get(addr)
        lag = None if not match_indexes else max(0, commit_index - match) if match is not None else None
        voters.append({"id": nid, "address": addr, "lag": lag, "url": reg["url"] if reg else None,
                       "state": reg["state"] if reg else "unregistered",
                       "incarnation": reg["incarnation"] if reg else None})
    voters.sort(key=lambda v: (v["id"] is None, v["id"] or 0))
    return {"leader_id": leader_id, "voters": voters, "pending_change": dict(change) if change else None,
            "removed": sorted(c["id"] for c in controllers.values() if c["state"] == "removed")}
