"""How long a periodic check on the event loop waits before its next run (issue 25).

The silence reporter (every 1/8 of `replica_silence_report_ms`) and the ISR loop (every
300 ms) look at the led partitions whose followers are not quiet. After a follower broker
dies that is every partition it followed, until the controller's ISR removals arrive: at
30,000 partitions the silence scan alone took 39% of a survivor's CPU during the failover,
on the loop that must also apply the new leaderships and answer the producers. A check
that took `took_s` waits at least long enough that it holds at most
`PERIODIC_CHECK_LOOP_SHARE_MAX` of the loop; a cheap check keeps its interval."""
from __future__ import annotations

# the largest share of the event loop's time one periodic check may take
PERIODIC_CHECK_LOOP_SHARE_MAX = 0.25


def next_wait_s(interval_s: float, took_s: float, share_max: float = PERIODIC_CHECK_LOOP_SHARE_MAX) -> float:
    """The wait before the next run: `interval_s`, or longer so that a run taking `took_s`
    holds at most `share_max` of the loop (took / (took + wait) <= share_max)."""
    if took_s <= 0 or share_max >= 1:
        return interval_s
    return max(interval_s, took_s * (1 - share_max) / share_max)
