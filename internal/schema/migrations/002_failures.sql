-- 002: failures that survive restarts, and dead letters.
--
-- message_attempts counts the attempts of a message that is being retried on
-- its own. An attempt is recorded (committed) BEFORE the handler runs, so an
-- attempt that kills the process is counted too; the row is deleted in the
-- transaction that finally applies or dead-letters the message.
CREATE TABLE {{schema}}.message_attempts (
    consumer         text        NOT NULL,
    topic            text        NOT NULL,
    partition        integer     NOT NULL,
    kafka_offset     bigint      NOT NULL,
    message_id       text,
    attempts         integer     NOT NULL,
    first_attempt_at timestamptz NOT NULL DEFAULT now(),
    last_attempt_at  timestamptz NOT NULL DEFAULT now(),
    last_error_class text,
    last_error       text,
    -- the attempt last_error belongs to: when it is not attempts - 1 at the
    -- start of an attempt, the previous attempt ended without an error (the
    -- process died)
    last_error_attempt integer,
    PRIMARY KEY (consumer, topic, partition, kafka_offset)
);

-- partition_runs counts consecutive assignments of a partition that started
-- at the same offset. Two starts at one offset mean the previous run made no
-- progress (it probably died mid-batch), so the next run goes one message at
-- a time, counting attempts, until it is past the suspect batch.
CREATE TABLE {{schema}}.partition_runs (
    consumer     text        NOT NULL,
    topic        text        NOT NULL,
    partition    integer     NOT NULL,
    start_offset bigint      NOT NULL,
    starts       integer     NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, topic, partition)
);

-- dead_letters keeps every message set aside, whole, with why. It is written
-- in the same transaction that marks the message dead-lettered in
-- processed_messages and moves the partition's position past it.
CREATE TABLE {{schema}}.dead_letters (
    id               bigserial   PRIMARY KEY,
    consumer         text        NOT NULL,
    topic            text        NOT NULL,
    partition        integer     NOT NULL,
    kafka_offset     bigint      NOT NULL,
    -- NULL when no valid id could be derived from the message.
    message_id       text,
    message_key      bytea,
    message_value    bytea,
    -- [{"key": "...", "value": "<base64>"}, ...]
    headers          jsonb       NOT NULL DEFAULT '[]',
    message_time     timestamptz,
    error_class      text        NOT NULL,
    error            text        NOT NULL,
    attempts         integer     NOT NULL,
    first_failed_at  timestamptz NOT NULL,
    last_failed_at   timestamptz NOT NULL,
    dead_lettered_at timestamptz NOT NULL DEFAULT now(),
    -- set when the letter was published to the dead-letter topic
    published_at     timestamptz,
    -- set when a redrive applied the message
    redriven_at      timestamptz,
    UNIQUE (consumer, topic, partition, kafka_offset)
);

CREATE INDEX dead_letters_consumer_dead_lettered_at_idx
    ON {{schema}}.dead_letters (consumer, dead_lettered_at);

CREATE INDEX dead_letters_unpublished_idx
    ON {{schema}}.dead_letters (consumer, id) WHERE published_at IS NULL;
