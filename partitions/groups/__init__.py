"""Consumer groups, pure core (no asyncio, no sockets, no clocks of its own).

- `assignors.py`: server-side partition assignors (range, roundrobin, sticky).
- `records.py`: the `__consumer_offsets` record encoding (deterministic) and group -> partition.
- `coordinator.py`: `GroupCoordinatorState`, the membership state machine (KIP-848 style
  join / heartbeat / leave / session expiry, member epochs, revocation before assignment)
  plus the committed-offsets cache of one `__consumer_offsets` partition, rebuilt by replay.

The broker shell (`http_api/broker/groups.py`) writes the records this core returns into
`__consumer_offsets` with acks=all and serves HTTP.
"""
