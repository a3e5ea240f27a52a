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
-- So every such transaction opens with open_request, which inserts a row
-- into open_requests and keeps where it went (its ctid) in a setting of
-- the transaction, and the server's closing round trip begins with
-- close_request, which deletes that row, clears the setting, and raises
-- SQLSTATE KO004 when there is nothing to delete: the transaction is no
-- longer the one the server opened (a setting of the transaction ends
-- with it). The row's deferred constraint trigger checks at COMMIT that
-- the request was closed, and refuses the COMMIT (KO004, and the
-- transaction rolls back) when it was not.
--
-- The table is UNLOGGED and has no index: its rows never outlive their
-- transaction (they are deleted before every COMMIT, or rolled back), so
-- there is nothing to recover after a crash, the two writes per request
-- cost no WAL, and each is found by its ctid: the dead rows vacuum has
-- not yet removed cost nothing to step over.
CREATE UNLOGGED TABLE {{schema}}.open_requests (
    backend integer NOT NULL DEFAULT pg_backend_pid()
);

-- PL/pgSQL, like the others: it keeps its plans for the session, where an
-- SQL function holding an INSERT would be planned again at every call.
CREATE FUNCTION {{schema}}.open_request()
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    opened tid;
BEGIN
    INSERT INTO {{schema}}.open_requests DEFAULT VALUES RETURNING ctid INTO opened;
    PERFORM set_config('kafkaonce.open_request', opened::text, true);
END
$$;

CREATE FUNCTION {{schema}}.close_request()
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    DELETE FROM {{schema}}.open_requests
        WHERE ctid = nullif(current_setting('kafkaonce.open_request', true), '')::tid;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'kafkaonce: the request''s transaction is not open: a statement of the handler''s ended the transaction the server opened'
            USING ERRCODE = 'KO004';
    END IF;
    PERFORM set_config('kafkaonce.open_request', '', true);
END
$$;

CREATE FUNCTION {{schema}}.refuse_open_request_commit()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    IF coalesce(current_setting('kafkaonce.open_request', true), '') <> '' THEN
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
