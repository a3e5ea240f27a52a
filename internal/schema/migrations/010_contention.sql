-- 010: how each partition run adapts to contention, for kafkaonce status.
--
-- When a partition's transactions lose races for rows (deadlocks,
-- serialization failures, lock timeouts), the worker shrinks its batches
-- and, for a while, serializes its transactions behind the consumer's
-- others. It writes what it is doing to its run's record, in the
-- transaction that commits its next batch, and only when something
-- changed: a partition that never meets contention never writes these.
--
-- batch_limit: the most messages the run's next transaction covers; NULL
-- while it is Config.MaxBatch, untouched by contention.
-- contention_retries: transactions of the run that lost a race and ran
-- again.
-- last_contention_at: when the last of them lost.
-- serialized_until: until when the run's transactions wait their turn at
-- the consumer's gate (in the past: they race again).
ALTER TABLE {{schema}}.partition_runs
    ADD COLUMN batch_limit integer,
    ADD COLUMN contention_retries bigint NOT NULL DEFAULT 0,
    ADD COLUMN last_contention_at timestamptz,
    ADD COLUMN serialized_until timestamptz;
