-- 004: the transactional outbox.
--
-- Rows are written in the same transaction as the change they announce and
-- delivered afterwards by a relay: to a Kafka topic, or to a function (an
-- external API). Delivered rows are deleted; rows that cannot be delivered
-- are parked (failed_at set), visible and retryable, never dropped.
CREATE TABLE {{schema}}.outbox (
    seq             bigserial   PRIMARY KEY,
    -- the message id: sent as the message-id header, or as the idempotency
    -- key of an API call, so the receiver can deduplicate
    id              text        NOT NULL UNIQUE,
    -- a topic, or the name of a delivery function
    destination     text        NOT NULL,
    message_key     bytea,
    -- relays lock buckets of keys, so one key is delivered in order even
    -- with several relays running
    key_bucket      integer     NOT NULL,
    message_value   bytea,
    headers         jsonb       NOT NULL DEFAULT '[]',
    created_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT '-infinity',
    last_error      text,
    failed_at       timestamptz
);

CREATE INDEX outbox_pending_idx ON {{schema}}.outbox (key_bucket, seq) WHERE failed_at IS NULL;
CREATE INDEX outbox_failed_idx ON {{schema}}.outbox (failed_at) WHERE failed_at IS NOT NULL;
