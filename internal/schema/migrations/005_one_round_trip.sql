-- 005: batches in one round trip.
--
-- A batch whose handler only queues its statements is sent to Postgres in
-- one pipeline: BEGIN, this check, the claims, the effects, the new
-- position, COMMIT. Nothing is read back before the COMMIT, so anything
-- that must stop the transaction has to do it by raising an error, which
-- makes the server skip the rest of the pipeline, COMMIT included.
--
-- check_position locks the partition's stored position (as the two-trip
-- path's SELECT ... FOR UPDATE does) and raises SQLSTATE KO001 when it is
-- missing or behind the position the worker committed last: the database
-- lost committed transactions, and the worker must not move the position
-- past messages whose effects are gone.
CREATE FUNCTION {{schema}}.check_position(p_consumer text, p_topic text, p_partition integer, p_believed bigint)
RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    stored bigint;
BEGIN
    SELECT next_offset INTO stored FROM {{schema}}.consumer_offsets
    WHERE consumer = p_consumer AND topic = p_topic AND partition = p_partition
    FOR UPDATE;
    IF stored IS NULL OR stored < p_believed THEN
        RAISE EXCEPTION 'kafkaonce: the stored position of %/% is % but % was committed', p_topic, p_partition, coalesce(stored::text, 'missing'), p_believed
            USING ERRCODE = 'KO001';
    END IF;
    RETURN stored;
END
$$;
