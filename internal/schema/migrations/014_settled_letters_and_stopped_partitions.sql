-- 014: what an operator closes by hand, and where a partition stopped.
--
-- Dead letters. An operator may settle a letter instead of redriving it:
-- its effect was made by other means, or is not wanted. settled_at is when.
-- A settled letter is no longer open: it is not redriven (not on request,
-- not by Consumer.Redrive, which checks it under the letter's lock) and not
-- counted among the letters that wait. It stays, as the record of the
-- message; its claim stays dead-lettered, so a later copy of the message is
-- still taken for the same message and skipped.
ALTER TABLE {{schema}}.dead_letters
    ADD COLUMN settled_at timestamptz;

-- Partition runs. A partition that stops at a message it must not skip
-- (HookPartitionStopped) used to say so only in its own process: its log
-- and its hooks. The run now records when and why on its record, so that
-- kafkaonce serve, in another process, shows it; the next assignment of the
-- partition clears both, as it starts a new run.
ALTER TABLE {{schema}}.partition_runs
    ADD COLUMN stopped_at  timestamptz,
    ADD COLUMN stop_reason text;
