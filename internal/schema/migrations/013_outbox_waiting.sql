-- 013: the outbox rows that are waiting for a retry.
--
-- A row that failed waits until next_attempt_at, and holds back the later
-- rows of its key, written before or after it began waiting. The relay
-- reads the waiting rows of the buckets it looks at every round; this index
-- holds only rows that were ever attempted and not delivered (a fresh row's
-- next_attempt_at is '-infinity'), so it stays small and writing a row
-- costs nothing more.
--
-- A row with an empty key is in bucket 0, as one without a key is: to the
-- relay they are one key, and a key's rows must share a bucket, or two
-- relays could take them at once. Rows written before are moved there.
UPDATE {{schema}}.outbox SET key_bucket = 0 WHERE message_key = ''::bytea AND key_bucket <> 0;

CREATE INDEX outbox_waiting_idx ON {{schema}}.outbox (key_bucket, seq) INCLUDE (message_key, next_attempt_at, destination)
    WHERE failed_at IS NULL AND next_attempt_at > '-infinity';
