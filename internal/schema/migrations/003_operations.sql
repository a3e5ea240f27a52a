-- 003: operations.
--
-- An operator asks for a redrive from the CLI; the consumer that owns the
-- letters (it has the handler) performs it and records the outcome.
ALTER TABLE {{schema}}.dead_letters
    ADD COLUMN redrive_requested_at timestamptz,
    ADD COLUMN redrive_error        text;

CREATE INDEX dead_letters_redrive_requested_idx
    ON {{schema}}.dead_letters (consumer, id)
    WHERE redrive_requested_at IS NOT NULL AND redriven_at IS NULL;

-- A consumer that treats suspect duplicates (same content, another id, within
-- a short window) as duplicates claims their ids with this status.
ALTER TABLE {{schema}}.processed_messages
    DROP CONSTRAINT processed_messages_status_check,
    ADD CONSTRAINT processed_messages_status_check
        CHECK (status IN ('applied', 'dead_lettered', 'invalid', 'suspect_duplicate'));

-- suspect_duplicates records messages whose content was seen shortly before
-- under another id in the same partition: the mark of a producer that makes
-- a fresh id on every retry. Written in the transaction that handled (or, by
-- choice, skipped) the message.
CREATE TABLE {{schema}}.suspect_duplicates (
    consumer         text        NOT NULL,
    topic            text        NOT NULL,
    partition        integer     NOT NULL,
    kafka_offset     bigint      NOT NULL,
    message_id       text        NOT NULL,
    fingerprint      bytea       NOT NULL,
    first_message_id text        NOT NULL,
    first_offset     bigint      NOT NULL,
    skipped          boolean     NOT NULL,
    detected_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, topic, partition, kafka_offset)
);
