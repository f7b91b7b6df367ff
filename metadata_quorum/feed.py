"""The broker's side of the metadata feed, pure: whole changes and copy-on-write images.

The controller applies every metadata batch atomically (a topic with all its partitions,
a broker fencing with all its leader changes) but its feed (`GET /controller/v1/metadata/
records`) pages the record log: one answer holds at most `feed_records_per_response_max`
records and may end in the middle of a batch. `FeedState` turns those pages into whole
changes:

- records are buffered (`pending`) until the feed says they end at a batch boundary: the
  answer's `metadata_offset` (the controller's applied offset, read after the records
  under its state machine's lock, which is held across whole batches) equals the offset
  after the last buffered record, or an answer's `batch_ends` (the offset after each
  entry that ends inside its page) names an offset within the buffer. The buffer is
  released up to the LAST such boundary and the rest waits for the next page; readers
  never see half a batch. Without `batch_ends` a broker could publish nothing while the
  controller kept committing: at 100,000 partitions a fencing's leader changes (33,334
  records) waited 20 s for the 66,667 follow-up ISR removals written after them.
- a complete change is replayed into a NEW image (`apply_records`): the published image is
  never mutated, so a reader holding it sees one consistent offset. Only what the change
  touches is copied (the top-level maps and the TopicImage of each topic it names: a dict
  copy of that topic's partitions), never the whole image: the cost of a change is its
  size plus the size of the topics it touches.

Every image `accept` returns carries how it was made, for its consumer (`change_of`):
the offset it was made from and the change's records (so the broker's replica manager
looks only at what changed), and the FeedState itself (the metadata lag: `lag`).

Invariant: `image` is the last complete image; `image.offset + len(pending)` is the next
feed offset to ask for; `batch_ends` holds only boundaries beyond `image.offset`.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Callable, Generator, Iterable, Optional

from metadata_quorum.image import MetadataImage, TopicImage
from metadata_quorum.records import (
    BrokerRegistrationChangeRecord,
    ConfigRecord,
    FenceBrokerRecord,
    LeaderChangeRecord,
    NoOpRecord,
    PartitionChangeRecord,
    PartitionRecord,
    ProducerIdsRecord,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
    UnfenceBrokerRecord,
    record_from_dict,
    records_of_run,
)
from metadata_quorum.security.records import SECURITY_RECORDS

_BROKER_RECORDS = (RegisterBrokerRecord, BrokerRegistrationChangeRecord, FenceBrokerRecord, UnfenceBrokerRecord)
# records that touch no topic
_TOPICLESS = (*_BROKER_RECORDS, ProducerIdsRecord, LeaderChangeRecord, NoOpRecord, *SECURITY_RECORDS)


@dataclass
class MetadataDelta:
    """What one applied change touched, for the broker's replica manager.

    `partitions`: topic -> partition ids whose registration changed (None: every partition
    of the topic, e.g. a new or re-created topic); `topics_configs`: topics whose configs
    changed; `removed_topics`: names gone (or re-created under a new id); `brokers`: broker
    ids whose registration changed. `everything`: the change could not be itemized (a
    snapshot or an unknown record type): look at the whole image."""

    partitions: dict = field(default_factory=dict)
    topics_configs: set = field(default_factory=set)
    removed_topics: set = field(default_factory=set)
    brokers: set = field(default_factory=set)
    everything: bool = False

    def partition_count(self, image: MetadataImage) -> int:
        """How many partition registrations the change touched (None entries: the topic's)."""
        n = 0
        for topic, parts in self.partitions.items():
            if parts is None:
                t = image.topics.get(topic)
                n += len(t.partitions) if t is not None else 0
            else:
                n += len(parts)
        return n


def describe_records(records: Iterable) -> MetadataDelta:
    """The delta of a record sequence (see MetadataDelta)."""
    delta = MetadataDelta()
    for r in records:
        if isinstance(r, (PartitionRecord, PartitionChangeRecord)):
            parts = delta.partitions.setdefault(r.topic, set())
            if parts is not None:
                parts.add(r.partition)
        elif isinstance(r, TopicRecord):
            delta.partitions[r.name] = None        # new (or re-created): every partition
            delta.topics_configs.add(r.name)
        elif isinstance(r, RemoveTopicRecord):
            delta.removed_topics.add(r.name)
            delta.partitions.pop(r.name, None)
        elif isinstance(r, ConfigRecord):
            if r.resource_type == "topic":
                delta.topics_configs.add(r.resource_name)
        elif isinstance(r, _BROKER_RECORDS):
            delta.brokers.add(r.broker_id)
        elif isinstance(r, _TOPICLESS):
            pass
        elif hasattr(r, "topic"):   # a record type added later: by what it names
            if hasattr(r, "partition"):
                parts = delta.partitions.setdefault(r.topic, set())
                if parts is not None:
                    parts.add(r.partition)
            else:
                delta.partitions[r.topic] = None
                delta.topics_configs.add(r.topic)
        elif hasattr(r, "broker_id"):
            delta.brokers.add(r.broker_id)
        else:
            delta.everything = True
    return delta


def _topics_named(records: list) -> Optional[set]:
    """Topic names a record sequence may change (None: it may change any topic)."""
    names: set = set()
    for r in records:
        if isinstance(r, (PartitionRecord, PartitionChangeRecord)):
            names.add(r.topic)
        elif isinstance(r, (TopicRecord, RemoveTopicRecord)):
            names.add(r.name)
        elif isinstance(r, ConfigRecord):
            if r.resource_type == "topic":
                names.add(r.resource_name)
        elif hasattr(r, "topic"):   # a record type added later: by what it names
            names.add(r.topic)
        elif not isinstance(r, _TOPICLESS) and not hasattr(r, "broker_id"):
            return None
    return names


def _copy_containers(obj) -> object:
    """A shallow copy of `obj` whose dict/list/set attributes are copied one level deeper
    (the image's replay mutates only those, in place)."""
    out = copy.copy(obj)
    for name, value in vars(obj).items():
        if isinstance(value, dict):
            setattr(out, name, {k: (copy.copy(v) if isinstance(v, (dict, list, set)) else v)
                                for k, v in value.items()})
        elif isinstance(value, (list, set)):
            setattr(out, name, copy.copy(value))
    return out


def _copy_topic(t: TopicImage) -> TopicImage:
    return _copy_containers(t)   # partitions hold frozen registrations: a dict copy suffices


def apply_records(image: MetadataImage, records: list) -> MetadataImage:
    """A new image: `image` with `records` replayed; `image` itself is left unchanged.
    Copies the top-level maps and the TopicImage of every topic the records name (every
    topic when a record type is unknown), never the partitions' registrations (frozen)."""
    new = _clone_for(image, records)
    for r in records:
        new.replay(r)
    return new


def _clone_for(image: MetadataImage, records: list) -> MetadataImage:
    """The copy of `image` that replaying `records` may mutate (see apply_records)."""
    new = copy.copy(image)
    new.__dict__.pop("feed_change", None)   # how the OLD image was made
    for name, value in vars(image).items():
        if name in ("topics", "feed_change"):
            continue
        if isinstance(value, dict):
            setattr(new, name, {k: (copy.copy(v) if isinstance(v, (dict, list, set)) else v)
                                for k, v in value.items()})
        elif isinstance(value, (list, set)):
            setattr(new, name, copy.copy(value))
    topics = dict(image.topics)
    names = _topics_named(records)
    for name in (topics.keys() if names is None else names):
        t = topics.get(name)
        if t is not None:
            topics[name] = _copy_topic(t)
    new.topics = topics
    return new


@dataclass(frozen=True)
class ChangeInfo:
    """How a feed image was made: replaying `records` on the image at `base_offset`
    (`records` None: from a snapshot), by the FeedState `source`."""

    base_offset: Optional[int]
    records: Optional[list]
    source: "FeedState"


def change_of(image) -> Optional[ChangeInfo]:
    """The ChangeInfo of an image FeedState made (None for any other image)."""
    return getattr(image, "feed_change", None)


@dataclass
class Change:
    """A whole change to publish: the new image and its records (None: a snapshot replaced
    the image) with their delta."""

    image: MetadataImage
    records: Optional[list]
    delta: MetadataDelta


class FeedState:
    """Buffers feed pages and releases whole changes (see the module docstring)."""

    def __init__(self, image: Optional[MetadataImage] = None, clock: Optional[Callable[[], float]] = None) -> None:
        self.image = image if image is not None else MetadataImage()
        self.pending: list = []
        self.batch_ends: set = set()  # batch boundaries the feed named beyond image.offset
        self.controller_offset = 0    # the controller's applied offset in the last answer
        self._clock = clock           # seconds (monotonic) for the lag; None: lag ms stays 0
        self._published = 0           # the offset its consumer has published (observe)
        self._behind_since: Optional[float] = None

    @property
    def next_offset(self) -> int:
        """The feed offset to ask for next (after the buffered records)."""
        return self.image.offset + len(self.pending)

    def accept(self, body: dict) -> Optional[Change]:
        """Take one feed answer; returns the change to publish once the buffered records end
        at a batch boundary (None: nothing new, or a batch is still incomplete)."""
        steps = self.accept_in_steps(body)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value

    def accept_in_steps(self, body: dict, chunk_records: int = 0) -> Generator[None, None, Optional[Change]]:
        """`accept` as a generator that pauses (yields None) after every `chunk_records`
        records parsed or replayed (0: never), so an event loop can serve requests while a
        change of thousands of partitions is built; its return value is `accept`'s. The
        published image is untouched until it returns."""
        cluster_id = body.get("cluster_id")
        controller_offset = body.get("metadata_offset")
        if body.get("snapshot") is not None:
            image = MetadataImage.from_snapshot(body["snapshot"])
            if cluster_id:
                image.cluster_id = cluster_id
            self.pending = []
            self.batch_ends = set()
            self.image = image
            self.controller_offset = max(image.offset, controller_offset or 0)
            image.feed_change = ChangeInfo(None, None, self)
            self._note_behind()
            return Change(image, None, MetadataDelta(everything=True))
        expected, pending = self.next_offset, self.pending
        parsed = 0   # records parsed since the last pause
        for item in body.get("records", []):
            if item["offset"] != expected:
                break  # gap or overlap: ask again from our offset
            run = item.get("run")
            if run is not None:   # consecutive partition records of one topic (records.records_of_run)
                records = records_of_run(run)
                pending.extend(records)
                expected += len(records)
                parsed += len(records)
            else:
                pending.append(record_from_dict(item["record"]))
                expected += 1
                parsed += 1
            if chunk_records and parsed >= chunk_records:
                parsed = 0
                yield None
                expected, pending = self.next_offset, self.pending   # as at the start (nothing else changes them)
        if controller_offset is not None:
            self.controller_offset = controller_offset
        base = self.image.offset
        for end in body.get("batch_ends") or ():
            if type(end) is int and end > base:
                self.batch_ends.add(end)
        self._note_behind()
        if cluster_id and not self.image.cluster_id and not self.pending:
            self.image.cluster_id = cluster_id   # before the first change: nobody reads it yet
        if not self.pending:
            return None
        # the controller applies a batch whole under its state machine's lock; an answer
        # whose records end exactly at the offset it reported ends at a batch boundary
        # (an answer without metadata_offset comes from an older controller: take it whole),
        # and so does every offset it names in batch_ends
        cut = self.next_offset
        if controller_offset is not None and cut < controller_offset:
            cut = max((e for e in self.batch_ends if e <= cut), default=base)
            if cut <= base:
                return None
        records, self.pending = self.pending[:cut - base], self.pending[cut - base:]
        self.batch_ends = {e for e in self.batch_ends if e > cut}
        image = _clone_for(self.image, records)
        for i, r in enumerate(records):
            image.replay(r)
            if chunk_records and i % chunk_records == chunk_records - 1:
                yield None
        if cluster_id:
            image.cluster_id = cluster_id
        image.feed_change = ChangeInfo(base, records, self)
        self.image = image
        return Change(image, records, describe_records(records))

    # ---------------------------------------------------------------- lag
    def observe(self, published_offset: int) -> None:
        """The consumer published the image at `published_offset` (the lag is measured
        from what readers see, not from what was received)."""
        self._published = published_offset
        self._note_behind()

    def _note_behind(self) -> None:
        if self.controller_offset > self._published:
            if self._behind_since is None and self._clock is not None:
                self._behind_since = self._clock()
        else:
            self._behind_since = None

    def lag(self) -> tuple[int, int]:
        """(records the controller has applied that readers do not see yet, for how many ms
        the published image has been behind the controller without catching up)."""
        records = max(0, self.controller_offset - self._published)
        if records == 0 or self._behind_since is None or self._clock is None:
            return records, 0
        return records, int((self._clock() - self._behind_since) * 1000)
