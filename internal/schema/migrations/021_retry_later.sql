-- 021: messages set aside to be tried again later (consumer.RetryLater).
--
-- A message whose handler asked to be retried later, or that failed under
-- Config.RetryLater, is set aside as a dead letter of class retry_later in
-- the transaction that moves its partition past it, with the time it is
-- due again in retry_at. The consumer's maintenance redrives due letters
-- as it redrives requested ones (a transaction per letter that claims the
-- message id again), and on a failure counts it in retries and sets the
-- next retry_at, until the policy's bound: then retry_at is cleared and
-- the letter is an ordinary dead letter (class retries_exhausted).
ALTER TABLE {{schema}}.dead_letters
    ADD COLUMN retry_at timestamptz,
    ADD COLUMN retries  integer NOT NULL DEFAULT 0;

CREATE INDEX dead_letters_retry_due ON {{schema}}.dead_letters (consumer, retry_at)
    WHERE retry_at IS NOT NULL AND redriven_at IS NULL AND settled_at IS NULL;
