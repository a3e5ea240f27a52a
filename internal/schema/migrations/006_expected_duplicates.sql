-- 006: re-sent messages in one round trip.
--
-- A worker remembers which message ids it has seen recently, with their
-- content (the suspect-duplicate window). A message that comes again with
-- the same id and content after its first copy committed is almost surely
-- already claimed, so a one-round-trip batch skips it without claiming it
-- and asks this function to make sure: expect_claimed raises SQLSTATE KO002
-- unless every given id is claimed by the consumer with the given
-- fingerprint. Raising stops the pipeline before its COMMIT, and the batch
-- then runs the ordinary way (claim, then look up what was taken). Memory
-- only predicts; the database decides.
--
-- Each id is looked up through the primary key, one by one (the LATERAL
-- subquery with LIMIT cannot be turned into a join): a plain join was
-- planned as a hash join over the whole table while its statistics were
-- those of a small one, reading every row for a hundred ids.
CREATE FUNCTION {{schema}}.expect_claimed(p_consumer text, p_ids text[], p_fingerprints bytea[])
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    present integer;
BEGIN
    SELECT count(*) INTO present
    FROM unnest(p_ids, p_fingerprints) AS e(message_id, fingerprint),
    LATERAL (SELECT 1 FROM {{schema}}.processed_messages AS p
             WHERE p.consumer = p_consumer AND p.message_id = e.message_id AND p.fingerprint = e.fingerprint
             LIMIT 1) AS found;
    IF present <> cardinality(p_ids) THEN
        RAISE EXCEPTION 'kafkaonce: % of % re-sent messages of consumer % are not claimed with the same content', cardinality(p_ids) - present, cardinality(p_ids), p_consumer
            USING ERRCODE = 'KO002';
    END IF;
END
$$;
