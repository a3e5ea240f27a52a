-- 022: the session kafkaonce's statements rely on, checked by the server
-- once user code is done with a transaction.
--
-- A handler gets a transaction it may send any one statement at a time
-- through, and a statement can change the session: SET LOCAL
-- client_encoding (and the server reads the text arguments of every
-- statement after it, kafkaonce's claims and stored keys among them, in
-- that encoding), search_path (and an unqualified function or operator
-- of kafkaonce's could be one of the handler's), session_replication_role
-- (replica turns off every trigger, the commit checks and foreign keys
-- among them), standard_conforming_strings, the role. The first statement
-- kafkaonce sends once user code is done, before any statement that
-- names or writes anything of its own, calls after_user_code, which
-- refuses to go on (SQLSTATE KO005, and the transaction can never commit)
-- when a setting is not as kafkaonce's statements need it, and puts the
-- role back: kafkaonce's statements run as the role the transaction began
-- with, so a handler may SET LOCAL ROLE for row-level security.
--
-- as_began and as_handler switch the role to the one the transaction
-- began with and back to the handler's, around what kafkaonce runs in the
-- middle of a handler's work (the commit check lifted around its SET
-- CONSTRAINTS): that too runs as the transaction began, whatever role the
-- handler set.
--
-- The caller passes its current_schemas(true): inside, the function runs
-- with a search_path of its own, so that nothing of a handler's can stand
-- in for what it calls; pg_catalog must come first among the caller's
-- schemas other than the temporary one (which is never searched for
-- functions or operators). The role and the session user the transaction
-- began with are kept in the transaction's settings kafkaonce.role and
-- kafkaonce.session_user by its first statement; a handler that resets
-- them (RESET ALL) leaves the role as it is.
CREATE FUNCTION {{schema}}.as_began()
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    began_role text := coalesce(current_setting('kafkaonce.role', true), '');
BEGIN
    PERFORM set_config('kafkaonce.handler_role', current_setting('role'), true);
    IF began_role <> '' AND current_setting('role') <> began_role THEN
        PERFORM set_config('role', began_role, true);
    END IF;
END
$$;

CREATE FUNCTION {{schema}}.as_handler()
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    handler_role text := coalesce(current_setting('kafkaonce.handler_role', true), '');
BEGIN
    IF handler_role <> '' AND current_setting('role') <> handler_role THEN
        PERFORM set_config('role', handler_role, true);
    END IF;
END
$$;

CREATE FUNCTION {{schema}}.after_user_code(p_search_path name[])
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    first_schema name;
    began_as     text := coalesce(current_setting('kafkaonce.session_user', true), '');
BEGIN
    IF current_setting('client_encoding') <> 'UTF8' THEN
        RAISE EXCEPTION 'kafkaonce: user code set client_encoding to %: kafkaonce''s statements send their text in UTF8, so it must stay UTF8', current_setting('client_encoding')
            USING ERRCODE = 'KO005';
    END IF;
    IF current_setting('standard_conforming_strings') <> 'on' THEN
        RAISE EXCEPTION 'kafkaonce: user code turned standard_conforming_strings off: it must stay on'
            USING ERRCODE = 'KO005';
    END IF;
    IF current_setting('session_replication_role') <> 'origin' THEN
        RAISE EXCEPTION 'kafkaonce: user code set session_replication_role to %, which turns off the checks made at COMMIT: it must stay origin', current_setting('session_replication_role')
            USING ERRCODE = 'KO005';
    END IF;
    SELECT s INTO first_schema
        FROM unnest(p_search_path) WITH ORDINALITY AS u(s, i)
        WHERE s !~ '^pg_temp_[0-9]+$'
        ORDER BY i LIMIT 1;
    IF first_schema IS DISTINCT FROM 'pg_catalog' THEN
        RAISE EXCEPTION 'kafkaonce: user code set a search_path that puts % before pg_catalog, where its functions and operators would stand in for PostgreSQL''s in kafkaonce''s statements: leave pg_catalog first (it is, unless named after another schema)', first_schema
            USING ERRCODE = 'KO005';
    END IF;
    IF began_as <> '' AND session_user <> began_as THEN
        RAISE EXCEPTION 'kafkaonce: user code changed the session''s user from % to %: kafkaonce''s statements run as the session began', began_as, session_user
            USING ERRCODE = 'KO005';
    END IF;
    PERFORM {{schema}}.as_began();
END
$$;

-- The batch's commit check (migration 009) fires when a handler's SET
-- CONSTRAINTS … IMMEDIATE makes it immediate, as whatever role the
-- handler set, which may not read open_batches: the trigger reads it with
-- its owner's rights. It can run only as the trigger.
ALTER FUNCTION {{schema}}.refuse_open_batch_commit()
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp;

-- close_request, as before (migration 017), after after_user_code: the
-- closing round trip of an HTTP request's transaction begins with it.
CREATE FUNCTION {{schema}}.close_request(p_search_path name[])
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM {{schema}}.after_user_code(p_search_path);
    DELETE FROM {{schema}}.open_requests
        WHERE ctid = nullif(current_setting('kafkaonce.open_request', true), '')::tid;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'kafkaonce: the request''s transaction is not open: a statement of the handler''s ended the transaction the server opened, or reset its settings (RESET ALL)'
            USING ERRCODE = 'KO004';
    END IF;
    PERFORM set_config('kafkaonce.open_request', '', true);
END
$$;
