-- 017: only the server commits an HTTP request's transaction.
--
-- A request's handler (and a phased request's Start and Atomic phases)
-- writes its rows in the transaction that stores the request's key, or
-- its recovery point, with them. The guard around the handler's pgx.Tx
-- refuses to send a COMMIT or ROLLBACK, but a statement sent on the bare
-- connection (tx.Conn()) passes it by; a COMMIT there would make the
-- handler's rows durable without the key, and the client's retry would
-- run the handler again: two payments.
--
-- So every such transaction opens with open_request, which inserts the
-- session's row (its backend pid) into open_requests, and the server's
-- closing round trip begins with close_request, which deletes it and
-- raises SQLSTATE KO004 when there is nothing to delete: the transaction
-- is no longer the one the server opened. A deferred constraint trigger
-- checks at COMMIT that the row is gone, and refuses the COMMIT (KO004,
-- and the transaction rolls back) when it is not.
--
-- The table is UNLOGGED: its rows never outlive their transaction (they
-- are deleted before every COMMIT, or rolled back), so there is nothing
-- to recover after a crash, and the two writes per request cost no WAL.
CREATE UNLOGGED TABLE {{schema}}.open_requests (
    backend integer PRIMARY KEY
);

CREATE FUNCTION {{schema}}.open_request()
RETURNS void
LANGUAGE sql
AS $$
    INSERT INTO {{schema}}.open_requests (backend) VALUES (pg_backend_pid())
$$;

CREATE FUNCTION {{schema}}.close_request()
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    DELETE FROM {{schema}}.open_requests WHERE backend = pg_backend_pid();
    IF NOT FOUND THEN
        RAISE EXCEPTION 'kafkaonce: the request''s transaction is not open: a statement of the handler''s ended the transaction the server opened'
            USING ERRCODE = 'KO004';
    END IF;
END
$$;

CREATE FUNCTION {{schema}}.refuse_open_request_commit()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM {{schema}}.open_requests WHERE backend = NEW.backend) THEN
        RAISE EXCEPTION 'kafkaonce: a statement of the handler''s tried to commit the transaction of an HTTP request: refused, the transaction rolls back'
            USING ERRCODE = 'KO004';
    END IF;
    RETURN NULL;
END
$$;

CREATE CONSTRAINT TRIGGER open_requests_closed_at_commit
    AFTER INSERT ON {{schema}}.open_requests
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION {{schema}}.refuse_open_request_commit();
