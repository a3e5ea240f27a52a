-- 005: batches in one round trip.
--
-- A batch whose handler only queues its statements is sent to Postgres in
-- one pipeline: BEGIN, this function, the claims, the effects, COMMIT.
-- Nothing is read back before the COMMIT, so anything that must stop the
-- transaction has to do it by raising an error, which makes the server skip
-- the rest of the pipeline, COMMIT included.
--
-- advance_position moves the partition's stored position forward to
-- p_next, and raises SQLSTATE KO001 instead when the position is missing or
-- behind p_believed, the position the worker committed last: the database
-- lost committed transactions, and the worker must not move the position
-- past messages whose effects are gone. The row stays locked until COMMIT,
-- as the two-trip path's SELECT ... FOR UPDATE keeps it. It runs first in
-- the transaction, so a batch that will fail on the position fails before
-- it inserts anything.
CREATE FUNCTION {{schema}}.advance_position(p_consumer text, p_topic text, p_partition integer, p_believed bigint, p_next bigint)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    UPDATE {{schema}}.consumer_offsets
    SET next_offset = greatest(next_offset, p_next), updated_at = now()
    WHERE consumer = p_consumer AND topic = p_topic AND partition = p_partition
      AND next_offset >= p_believed;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'kafkaonce: the stored position of %/% is missing or behind %, the position this worker committed last', p_topic, p_partition, p_believed
            USING ERRCODE = 'KO001';
    END IF;
END
$$;
