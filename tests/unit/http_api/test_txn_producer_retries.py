"""The transactional Producer is idempotent (Kafka): each records request carries per-partition
base sequences under (producer id, epoch), so it is resent exactly as it was after any
retriable error, a lost answer included (the leaders answer what was already written with
its original offsets). Sequences continue across transactions of one epoch; a request that
finally fails forbids the commit, and the abort starts a new epoch (sequences from 0)."""
from __future__ import annotations

import time

import pytest

from http_api.client import Producer
from partitions.errors import ErrorCode, KraftlogError


def _producer(errors: list[ErrorCode], **kw) -> tuple[Producer, list[tuple[str, dict]]]:
    p = Producer("http://127.0.0.1:1", transactional_id="t", retry_backoff_ms=1, **kw)
    calls: list[tuple[str, dict]] = []
    epoch = [0]

    async def bootstrap_json(method, path, json_body=None, **_):
        calls.append((path, json_body))
        if errors:
            raise KraftlogError(errors.pop(0), "injected")
        if path.endswith("/init"):
            epoch[0] += 1
            return 200, {"producer_id": 1, "producer_epoch": epoch[0]}
        if path.endswith("/records"):
            return 200, {"offsets": [{"topic": r["topic"], "partition": r["partition"], "offset": 7}
                                     for r in json_body["records"]]}
        return 200, {}
    p.t.bootstrap_json = bootstrap_json
    p.producer_id, p.producer_epoch = 1, 0
    p.meta.doc = {"topics": []}
    p.meta._topics = {"a": {"name": "a", "partitions": [{"partition": 0}, {"partition": 1}]}}
    p.meta.fetched_at = time.monotonic()
    return p, calls


def _records_calls(calls):
    return [body for path, body in calls if path.endswith("/records")]


async def test_a_records_request_is_resent_unchanged_after_a_lost_answer():
    p, calls = _producer([ErrorCode.BROKER_NOT_AVAILABLE, ErrorCode.REQUEST_TIMED_OUT, ErrorCode.NOT_COORDINATOR])
    p.begin_transaction()
    fut = await p.send("a", "v", partition=1)
    await p.flush()
    sent = _records_calls(calls)
    assert len(sent) == 4 and all(b == sent[0] for b in sent)    # the same sequences every time
    assert sent[0]["sequences"] == [{"topic": "a", "partition": 1, "base_sequence": 0}]
    assert fut.result().offset == 7
    await p.t.close()


async def test_sequences_continue_per_partition_across_transactions_of_an_epoch():
    p, calls = _producer([])
    p.begin_transaction()
    for v in ("x", "y"):
        await p.send("a", v, partition=0)
    await p.send("a", "z", partition=1)
    await p.send("a", "k", key=b"key")                          # placed by the client
    await p.commit_transaction()
    p.begin_transaction()
    await p.send("a", "w", partition=0)
    await p.abort_transaction()                                 # nothing was written: no request
    p.begin_transaction()
    await p.send("a", "w", partition=0)
    await p.send("a", "u", partition=1)
    await p.commit_transaction()
    first, second = _records_calls(calls)
    keyed = first["records"][3]["partition"]
    assert keyed in (0, 1) and all("partition" in r for r in first["records"])
    n0 = 3 if keyed == 0 else 2
    assert first["sequences"] == [{"topic": "a", "partition": 0, "base_sequence": 0},
                                  {"topic": "a", "partition": 1, "base_sequence": 0}]
    assert second["sequences"] == [{"topic": "a", "partition": 0, "base_sequence": n0},
                                   {"topic": "a", "partition": 1, "base_sequence": 4 - n0}]
    await p.t.close()


@pytest.mark.parametrize("error", [ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                                   ErrorCode.INVALID_TXN_STATE])   # another partition may be written
async def test_a_failed_records_request_forbids_the_commit_and_the_abort_starts_a_new_epoch(error):
    p, calls = _producer([error])
    p.begin_transaction()
    fut = await p.send("a", "v", partition=0)
    with pytest.raises(KraftlogError) as e:
        await p.flush()
    assert e.value.code is error and fut.exception() is e.value
    with pytest.raises(KraftlogError) as e:
        await p.commit_transaction()                            # Kafka: no commit after a failed send
    assert e.value.code is ErrorCode.INVALID_TXN_STATE and "abort_transaction" in e.value.message
    assert not any(path.endswith("/commit") for path, _ in calls)
    await p.abort_transaction()
    assert [path.rsplit("/", 1)[1] for path, _ in calls][-2:] == ["abort", "init"]
    assert p.producer_epoch == 1
    p.begin_transaction()
    await p.send("a", "v2", partition=0)
    await p.commit_transaction()
    assert _records_calls(calls)[-1]["sequences"] == [{"topic": "a", "partition": 0, "base_sequence": 0}]
    assert _records_calls(calls)[-1]["producer_epoch"] == 1
    await p.t.close()
