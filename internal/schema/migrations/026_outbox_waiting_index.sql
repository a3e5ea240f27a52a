-- 026: the index of waiting outbox rows keeps no key and no destination.
--
-- outbox_waiting_idx (migration 013) carried each waiting row's key and
-- destination, so that the relay read them from the index alone. But an
-- index entry holds at most a third of a page: a row whose key or
-- destination is larger (a key of a few kilobytes, which Kafka allows)
-- could not be marked waiting after a failed delivery, since the UPDATE
-- that sets next_attempt_at failed on the index, and the row was
-- attempted again at every round, never waiting, never parked. The index
-- now holds only fixed-size columns; the relay reads the key and
-- destination of the few waiting rows from the table.
DROP INDEX {{schema}}.outbox_waiting_idx;
CREATE INDEX outbox_waiting_idx ON {{schema}}.outbox (key_bucket, seq) INCLUDE (next_attempt_at)
    WHERE failed_at IS NULL AND next_attempt_at > '-infinity';
