"""`Effects` collects partitions to wake and to truncate in linear time (issue 25): suspending
8,000 leaderships (the isolation rule) woke each partition through a membership test on a
list, quadratic, 4.8 s on a broker's event loop at 30,000 partitions."""
from partitions.replication.replica_state import Effects


class CountingList(list):
    """A list that counts membership tests."""
    contains = 0

    def __contains__(self, item) -> bool:
        CountingList.contains += 1
        return super().__contains__(item)


def test_wake_and_merge_keep_order_and_drop_duplicates_without_scanning_the_lists():
    eff = Effects(wake_fetches=CountingList(), start_truncation=CountingList())
    CountingList.contains = 0
    for i in range(20_000):
        eff.wake(("t", i))
        eff.wake(("t", i))               # a second wake of the same partition is a no-op
    other = Effects()
    for i in range(19_990, 20_010):
        other.wake(("t", i))
    other.start_truncation = [("t", 1), ("t", 2), ("t", 1)]
    eff.start_truncation.append(("t", 2))
    eff.merge(other)
    assert eff.wake_fetches == [("t", i) for i in range(20_010)]
    assert eff.start_truncation == [("t", 2), ("t", 1)]
    assert CountingList.contains == 0    # no membership test on the lists themselves
