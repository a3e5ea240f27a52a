-- 009: a batch checks that its transaction is still the one it opened.
--
-- A handler gets the consumer's transaction through a guard that refuses
-- Commit and Rollback, but a COMMIT or ROLLBACK statement sent as SQL
-- (tx.Exec("COMMIT"), or queued with Batch.Queue) ends the transaction all
-- the same. The statements after it would then run outside it — in a
-- transaction of their own, or, in a pipeline, in the implicit block the
-- server opens until the pipeline's end — and the position could move past
-- messages whose claims and effects were rolled back, or commit claims
-- whose effects were not written. The consumer sets kafkaonce.transaction
-- to 'open' for the transaction only (set_config(..., true)) when it opens
-- it, and calls this function after the handler's statements and before
-- its own: in any later transaction the setting is gone, and the function
-- raises SQLSTATE KO003, which ends the pipeline before its COMMIT.
CREATE FUNCTION {{schema}}.transaction_still_open()
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    IF current_setting('kafkaonce.transaction', true) IS DISTINCT FROM 'open' THEN
        RAISE EXCEPTION 'kafkaonce: the consumer''s transaction was ended before its COMMIT, by a COMMIT or ROLLBACK statement of the handler''s'
            USING ERRCODE = 'KO003';
    END IF;
END
$$;
