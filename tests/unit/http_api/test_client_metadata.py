"""Python client metadata following (docs/AVAILABILITY.md part E), without processes:
answers from several brokers merge with the highest leader epoch winning per partition;
suspect brokers are skipped while another one can answer, then become usable again; the
per-attempt and connect timeouts are bounded by request_timeout_ms."""
import time

from http_api.client.transport import MetadataCache, Transport, merge_metadata


def _doc(leader: int, epoch: int, brokers=(1, 2, 3), topics=("t",)) -> dict:
    return {"cluster_id": "c", "controller_id": 0,
            "brokers": [{"id": b, "url": f"http://b{b}:1", "rack": None, "fenced": False} for b in brokers],
            "topics": [{"name": n, "partitions": [{"partition": 0, "leader": leader, "leader_epoch": epoch,
                                                   "replicas": [1, 2, 3], "isr": [1, 2, 3]}]} for n in topics]}


def test_the_highest_leader_epoch_wins_per_partition_whatever_the_answer_order():
    stale, fresh = _doc(leader=1, epoch=4), _doc(leader=2, epoch=5)
    for answers in ([stale, fresh], [fresh, stale]):
        p = merge_metadata(answers)["topics"][0]["partitions"][0]
        assert (p["leader"], p["leader_epoch"]) == (2, 5)


def test_topics_and_brokers_known_to_any_answer_are_kept():
    merged = merge_metadata([_doc(1, 1, brokers=(1, 2), topics=("a",)), _doc(1, 1, brokers=(2, 3), topics=("a", "b"))])
    assert sorted(t["name"] for t in merged["topics"]) == ["a", "b"]
    assert sorted(b["id"] for b in merged["brokers"]) == [1, 2, 3]


def test_a_suspect_broker_is_skipped_while_another_can_answer_then_usable_again():
    t = Transport("http://b1:1,http://b2:1", client_id="x", request_timeout_ms=30_000, broker_suspect_ms=50)
    t._next = 0
    t.mark_suspect("http://b1:1/v1/topics/t/partitions/0/records")
    assert t.is_suspect("http://b1:1") and t.bootstrap_url() == "http://b2:1"
    t.mark_suspect("http://b2:1")
    assert t.bootstrap_url() in ("http://b1:1", "http://b2:1")   # all suspect: still one to try
    time.sleep(0.06)
    assert not t.is_suspect("http://b1:1") and not t.is_suspect("http://b2:1")


def test_metadata_names_every_known_broker_and_timeouts_are_bounded_by_the_request_timeout():
    t = Transport("http://b1:1", client_id="x", request_timeout_ms=1_500, request_attempt_timeout_ms=2_000,
                  connect_timeout_ms=3_000)
    assert (t.request_attempt_timeout_ms, t.connect_timeout_ms) == (1_500, 1_500)
    m = MetadataCache(t)
    m.doc = _doc(1, 1)
    assert m.broker_urls() == ["http://b1:1", "http://b2:1", "http://b3:1"]
    d = Transport("http://b1:1", client_id="x", request_timeout_ms=30_000)
    assert (d.request_attempt_timeout_ms, d.connect_timeout_ms) == (2_000, 1_000)
