-- 016: a partition held back by a producer's open transaction.
--
-- A consumer reads committed records only, in offset order, so a
-- transaction left open (a producer that died mid-transaction, one whose
-- transactions never end) holds back everything after its first record.
-- The run records it, so that kafkaonce status and serve show it in other
-- processes: held_at is the offset of the open transaction's first record,
-- where the partition waits, and held_since when the consumer first saw it
-- waiting there. Both are NULL while the partition is not held; the end of
-- the wait, and the next assignment, clear them.
ALTER TABLE {{schema}}.partition_runs
    ADD COLUMN held_at    bigint,
    ADD COLUMN held_since timestamptz;
