-- 009: only the consumer commits a batch's transaction.
--
-- A handler gets the consumer's transaction through a guard that refuses
-- Commit and Rollback, but a COMMIT or ROLLBACK statement sent as SQL
-- (tx.Exec("COMMIT"), or queued with Batch.Queue) would end the transaction
-- all the same. A COMMIT in the middle of a batch would make its claims
-- durable — those of messages whose handlers had not run yet included —
-- and a retry after any later failure would skip those messages for
-- claimed: lost without a word. After a ROLLBACK (AND CHAIN, or followed by
-- a BEGIN), the consumer's own statements would run in another
-- transaction.
--
-- So every batch transaction opens with open_batch, which inserts the
-- partition's row into open_batches, and closes with close_batch, after
-- the handlers' statements and before the consumer's own, which deletes it
-- and raises SQLSTATE KO003 when there is nothing to delete: the
-- transaction is no longer the one that opened the batch. A deferred
-- constraint trigger checks, when the transaction commits, that the row is
-- gone, and refuses the COMMIT (KO003, and the transaction rolls back)
-- when it is not: a COMMIT the consumer did not send, or a PREPARE
-- TRANSACTION, cannot make any of the batch durable. The table only ever
-- holds rows of transactions in progress; concurrent batches of one
-- partition (a member expelled but still working, and the new owner)
-- queue on its key, as they do on the partition's row in
-- consumer_offsets.
CREATE TABLE {{schema}}.open_batches (
    consumer  text    NOT NULL,
    topic     text    NOT NULL,
    partition integer NOT NULL,
    PRIMARY KEY (consumer, topic, partition)
);

CREATE FUNCTION {{schema}}.open_batch(p_consumer text, p_topic text, p_partition integer)
RETURNS void
LANGUAGE sql
AS $$
    INSERT INTO {{schema}}.open_batches (consumer, topic, partition) VALUES (p_consumer, p_topic, p_partition)
$$;

CREATE FUNCTION {{schema}}.close_batch(p_consumer text, p_topic text, p_partition integer)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    DELETE FROM {{schema}}.open_batches WHERE consumer = p_consumer AND topic = p_topic AND partition = p_partition;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'kafkaonce: the batch of %/% is not open in this transaction: a statement of the handler''s ended the transaction the consumer opened', p_topic, p_partition
            USING ERRCODE = 'KO003';
    END IF;
END
$$;

CREATE FUNCTION {{schema}}.refuse_open_batch_commit()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM {{schema}}.open_batches WHERE consumer = NEW.consumer AND topic = NEW.topic AND partition = NEW.partition) THEN
        RAISE EXCEPTION 'kafkaonce: a statement of the handler''s tried to commit the transaction of a batch of %/%: refused, the transaction rolls back', NEW.topic, NEW.partition
            USING ERRCODE = 'KO003';
    END IF;
    RETURN NULL;
END
$$;

CREATE CONSTRAINT TRIGGER open_batches_closed_at_commit
    AFTER INSERT ON {{schema}}.open_batches
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION {{schema}}.refuse_open_batch_commit();
