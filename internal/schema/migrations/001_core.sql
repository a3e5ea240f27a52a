-- 001: the core tables of the idempotent consumer.
--
-- processed_messages is the dedupe ledger: one row per (consumer, message id)
-- that was claimed in the same transaction as the message's effects.
CREATE TABLE {{schema}}.processed_messages (
    consumer     text        NOT NULL,
    message_id   text        NOT NULL,
    -- SHA-256 over the key and value (see dedupe.FingerprintOf). The same id
    -- arriving with another fingerprint is a producer bug and is reported.
    fingerprint  bytea       NOT NULL CHECK (octet_length(fingerprint) = 32),
    topic        text        NOT NULL,
    partition    integer     NOT NULL,
    kafka_offset bigint      NOT NULL,
    status       text        NOT NULL DEFAULT 'applied'
                             CHECK (status IN ('applied', 'dead_lettered', 'invalid')),
    attempts     integer     NOT NULL DEFAULT 1,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);

-- Pruning deletes the oldest rows of one consumer in bounded batches.
CREATE INDEX processed_messages_consumer_processed_at_idx
    ON {{schema}}.processed_messages (consumer, processed_at);

-- consumer_offsets is the processed position of each partition: the offset of
-- the next message to process. It is written in the same transaction as the
-- effects and only moves forward, so a rewound consumer group skips what was
-- already processed even after old processed_messages rows are pruned.
CREATE TABLE {{schema}}.consumer_offsets (
    consumer    text        NOT NULL,
    topic       text        NOT NULL,
    partition   integer     NOT NULL CHECK (partition >= 0),
    next_offset bigint      NOT NULL CHECK (next_offset >= 0),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, topic, partition)
);
