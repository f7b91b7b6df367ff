"""The transactional Producer resends a records request only after errors proving nothing was
written; an ambiguous failure (lost connection, timeout) is raised so the application aborts
instead of writing the records twice into the transaction."""
from __future__ import annotations

import pytest

from http_api.client import Producer
from partitions.errors import ErrorCode, KraftlogError


def _producer(errors: list[ErrorCode]) -> tuple[Producer, list[str]]:
    p = Producer("http://127.0.0.1:1", transactional_id="t", retry_backoff_ms=1)
    calls: list[str] = []

    async def bootstrap_json(method, path, **kw):
        calls.append(path)
        if errors:
            raise KraftlogError(errors.pop(0), "injected")
        return 200, {"offsets": [{"topic": "a", "partition": 0, "offset": 0}], "producer_id": 1,
                     "producer_epoch": 0}
    p.t.bootstrap_json = bootstrap_json
    p.producer_id, p.producer_epoch = 1, 0
    return p, calls


async def test_records_are_not_resent_after_an_ambiguous_failure():
    p, calls = _producer([ErrorCode.BROKER_NOT_AVAILABLE])
    p.begin_transaction()
    fut = await p.send("a", "v", partition=0)
    with pytest.raises(KraftlogError) as e:
        await p.flush()
    assert e.value.code is ErrorCode.BROKER_NOT_AVAILABLE and len(calls) == 1
    assert fut.exception() is e.value
    await p.t.close()


async def test_records_are_resent_after_errors_that_prove_nothing_was_written():
    p, calls = _producer([ErrorCode.CONCURRENT_TRANSACTIONS, ErrorCode.NOT_COORDINATOR])
    p.begin_transaction()
    fut = await p.send("a", "v", partition=0)
    await p.flush()
    assert len(calls) == 3 and fut.result().offset == 0
    # other calls (commit) retry any retriable error
    p2, calls2 = _producer([ErrorCode.BROKER_NOT_AVAILABLE])
    p2.begin_transaction()
    await p2.commit_transaction()
    assert len(calls2) == 2
    await p.t.close()
    await p2.t.close()
