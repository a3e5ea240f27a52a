-- 008: a dead letter names its message; a partition run names itself.
--
-- Dead letters. Writing a letter must be idempotent for the same message:
-- a batch that sets a message aside may run again after an unknown COMMIT
-- outcome, or on two members at once, and a message without a valid id has
-- no claim to stop the second letter. Until now that was done by keeping
-- one letter per (consumer, topic, partition, kafka_offset). But an offset
-- does not name a message for ever: after a topic is deleted and
-- re-created and the stored positions are reset (the documented
-- procedure), the new topic's messages come at the old one's offsets. A new
-- message set aside at the offset of an old letter was taken for that
-- letter and silently not written, while the transaction moved the
-- position past it: a message neither applied nor set aside.
--
-- So a letter is now unique per message, not per offset: the offset, the
-- content's fingerprint, the message id and the message's timestamp. A
-- record read again from the log has all four unchanged, so the same
-- message set aside twice still gives one letter; a different message at
-- the same offset differs in its content, its id or (for byte-identical
-- messages without an id) the time it was written, and gets its own.
--
-- fingerprint is the SHA-256 that dedupe.FingerprintOf computes in Go: the
-- key's length as a big-endian 64-bit integer, the key, the value, where a
-- missing (NULL) key or value counts as an empty one. It is generated from
-- the stored key and value, so old letters get theirs here and no writer
-- can store one that disagrees with the content. Readers that match a
-- letter to a message (the audit) compare it with the message's own.
ALTER TABLE {{schema}}.dead_letters
    ADD COLUMN fingerprint bytea NOT NULL GENERATED ALWAYS AS (
        sha256(int8send(octet_length(coalesce(message_key, ''::bytea))::bigint)
               || coalesce(message_key, ''::bytea) || coalesce(message_value, ''::bytea))
    ) STORED;

ALTER TABLE {{schema}}.dead_letters
    DROP CONSTRAINT dead_letters_consumer_topic_partition_kafka_offset_key;

-- Leads with the columns of the old key, so lookups by position still use it.
CREATE UNIQUE INDEX dead_letters_message_key ON {{schema}}.dead_letters
    (consumer, topic, partition, kafka_offset, fingerprint,
     (coalesce(message_id, '')), (coalesce(message_time, '-infinity'::timestamptz)));

-- Partition runs. A run that ends cleanly clears its record, so that the
-- next run does not take it for a run that died. It found its record by
-- the offset it started at; but a member expelled from the group (a
-- zombie) may still be finishing a run that started at the offset the new
-- owner's run starts at, and its clean end then cleared the new owner's
-- record: had the new owner died in its first batch, the run after it saw
-- one start instead of two, and went one message at a time one run late.
-- Each run now gets a number of its own when it records its start, and
-- ends only the record that still carries that number.
CREATE SEQUENCE {{schema}}.partition_runs_run_seq;

ALTER TABLE {{schema}}.partition_runs
    ADD COLUMN run bigint NOT NULL DEFAULT nextval('{{schema}}.partition_runs_run_seq');

ALTER SEQUENCE {{schema}}.partition_runs_run_seq OWNED BY {{schema}}.partition_runs.run;
