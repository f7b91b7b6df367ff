"""The example pipeline end to end (small data) against the session's real broker."""
from __future__ import annotations

import pytest

from pipelines import clickstream

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def test_clickstream_pipeline_output_matches_plain_python(spark, broker_url, tmp_path, capsys):
    code = clickstream.run(spark, broker_url, events_count=400, minutes=3, users=20, rounds=2,
                           pause_s=0.5, timeout_s=120, checkpoint=str(tmp_path / "chk"))
    out = capsys.readouterr().out
    assert code == 0, out
    assert "page-stats" in out and "OK:" in out


def test_expected_counts_is_per_page_per_minute():
    events = [{"page": "/a", "user": "u", "ts": 60_000 * 5 + 1}, {"page": "/a", "user": "v", "ts": 60_000 * 5 + 59_999},
              {"page": "/a", "user": "u", "ts": 60_000 * 6}, {"page": clickstream.FLUSH_PAGE, "user": "f", "ts": 0}]
    assert clickstream.expected_counts(events) == {("/a", 300_000): 2, ("/a", 360_000): 1}
