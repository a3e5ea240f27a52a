-- 015: each consumer records its settings when it starts.
--
-- kafkaonce's tools (audit, replay, status, serve) read a consumer's
-- tables, and to read its Kafka side they must know what the consumer
-- knows: how it derives message ids, its group, its topics, its brokers.
-- Told nothing, they assumed defaults (the message-id header, a group named
-- after the consumer), and an audit of a consumer whose ids come from a JSON
-- field reported every message as missing. So a consumer writes them here
-- at every start, and the tools use them unless told otherwise.
--
-- message_id_rule is the text of the consumer's built-in id rule
-- ("header:message-id", "json:meta.id", "hash", "position"; see
-- consumer.MessageIDRule), or 'custom' for a function of its own, which no
-- tool can run. brokers, kafka_tls and kafka_sasl (the SASL mechanism's
-- name, never a credential) say how the consumer reaches Kafka.
-- settings_recorded_at is when the consumer last started; the columns are
-- NULL for a consumer that has not started since this migration (or was
-- numbered by a claim alone), and set all together otherwise. A record is
-- the last start's: workers of one name started with different settings
-- (a rolling change) leave the last one's.
ALTER TABLE {{schema}}.consumers
    ADD COLUMN message_id_rule      text,
    ADD COLUMN group_id             text,
    ADD COLUMN topics               text[],
    ADD COLUMN brokers              text[],
    ADD COLUMN kafka_tls            boolean,
    ADD COLUMN kafka_sasl           text,
    ADD COLUMN settings_recorded_at timestamptz,
    ADD CONSTRAINT consumers_settings_check CHECK (
        settings_recorded_at IS NULL
        OR (message_id_rule IS NOT NULL AND group_id IS NOT NULL AND topics IS NOT NULL
            AND brokers IS NOT NULL AND kafka_tls IS NOT NULL));
