"""Partition log storage engine (Kafka's storage ladder, one job per module):

record_batch   the one batch codec (wire = disk format) shared by broker, client, Spark
config         LogConfig + Kafka topic config names/validation (pure)
index          sparse OffsetIndex / TimeIndex
segment        LogSegment: one .log file with its indexes
append         AppendInfo, BatchEntry: what an append carries between log, segment, producer state
producer_state idempotent producers' last batches (sequence and epoch checks)
cleaner_checkpoint  the cleaner's side files, truncated with the log
leader_epoch_cache  epoch -> start offset (OffsetsForLeaderEpoch)
log            Log: one partition replica's log
log_manager    LogManager: every log of a broker, checkpoints, clean shutdown marker
cleaner        LogCleaner: compaction (imports log; log never imports it)
errors         exceptions (no HTTP imports)

Nothing is imported here so that `partitions.log.config` stays cheap to import.
"""
