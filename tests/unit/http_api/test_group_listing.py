"""GET /v1/groups merges the coordinators' listings: one entry per group, and only from
the broker the metadata says leads the group's offsets partition."""
from __future__ import annotations

from types import SimpleNamespace

from http_api.broker.groups import GroupCoordinator
from partitions.groups.records import partition_for_group


def _topic(leaders: dict[int, int]):
    return SimpleNamespace(partitions={p: SimpleNamespace(leader=b) for p, b in leaders.items()})


def test_a_deposed_coordinators_listing_is_dropped_and_groups_are_listed_once():
    n = 4
    leaders = {p: 1 + p % 2 for p in range(n)}              # brokers 1 and 2 lead the offsets partitions
    ga, gb = "orders-app", "billing"
    owner_a, owner_b = leaders[partition_for_group(ga, n)], leaders[partition_for_group(gb, n)]
    stale = 3                                                # used to lead, has not seen the change yet
    listings = [
        {"group_id": ga, "members": 2, "coordinator_id": owner_a},
        {"group_id": ga, "members": 5, "coordinator_id": stale},
        {"group_id": gb, "members": 0, "coordinator_id": stale},
        {"group_id": gb, "members": 1, "coordinator_id": owner_b},
        {"group_id": gb, "members": 1, "coordinator_id": owner_b},   # answered twice (retry)
    ]
    got = GroupCoordinator._current_coordinators_only(listings, _topic(leaders))
    assert got == [{"group_id": gb, "members": 1, "coordinator_id": owner_b},
                   {"group_id": ga, "members": 2, "coordinator_id": owner_a}]


def test_no_offsets_topic_lists_nothing():
    assert GroupCoordinator._current_coordinators_only([{"group_id": "g", "coordinator_id": 1}], None) == []
