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
-- So every such transaction opens with a row in open_requests (the
-- server keeps where it went, its ctid, in the transaction's setting
-- kafkaonce.open_request), and the server's closing round trip begins
-- with close_request, which deletes that row, clears the setting, and
-- raises SQLSTATE KO004 when there is nothing to delete: the transaction
-- is no longer the one the server opened (a setting of the transaction
-- ends with it). The row cannot be committed: it references
-- uncommittable, which holds no row and never will, by a foreign key
-- checked at COMMIT. A COMMIT before the close fails with 23503 on
-- open_requests_closed_at_commit, and the transaction rolls back. A
-- foreign key's check at COMMIT skips a row deleted meanwhile without a
-- query, so the check costs little when it passes.
--
-- open_requests is UNLOGGED and has no index: its rows never outlive
-- their transaction, so there is nothing to recover after a crash, the
-- two writes per request cost no WAL, and each row is found by its ctid:
-- the dead rows vacuum has not yet removed cost nothing to step over.
CREATE TABLE {{schema}}.uncommittable (
    id integer PRIMARY KEY CHECK (false)
);

CREATE UNLOGGED TABLE {{schema}}.open_requests (
    backend integer NOT NULL DEFAULT pg_backend_pid(),
    never integer NOT NULL DEFAULT 0
        CONSTRAINT open_requests_closed_at_commit REFERENCES {{schema}}.uncommittable (id)
        DEFERRABLE INITIALLY DEFERRED
);

CREATE FUNCTION {{schema}}.close_request()
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    DELETE FROM {{schema}}.open_requests
        WHERE ctid = nullif(current_setting('kafkaonce.open_request', true), '')::tid;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'kafkaonce: the request''s transaction is not open: a statement of the handler''s ended the transaction the server opened, or reset its settings (RESET ALL)'
            USING ERRCODE = 'KO004';
    END IF;
    PERFORM set_config('kafkaonce.open_request', '', true);
END
$$;
