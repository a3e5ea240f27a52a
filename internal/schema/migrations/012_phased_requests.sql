-- 012: phased requests (package idempotency, Server.Phased).
--
-- A request whose work includes a call outside Postgres (a card provider)
-- cannot be one transaction, so it runs in phases, and its key's row
-- exists from its first phase on: status is NULL while the run is in
-- progress, and the row records where a resume starts.
--
-- flow: the name of the phased handler the run belongs to; its recovery
-- sweep resumes only its own runs.
-- run_id: the run's own id, random: what Run.DerivedKey derives from, so
-- that a key used again after it expired derives other keys.
-- recovery_point: the phase the run continues from; every phase commits
-- the next one.
-- state: what the last phase left for the next (its Continue). The
-- request's body is not kept: Start puts in state what later phases need,
-- so that a card number in a body is not stored by us.
-- lease_token, lease_until: who is running the run, and until when; a
-- retry or the sweep takes over a run whose lease ran out.
-- taken: how many times the run was taken (1 by its first request).
-- last_error: why the last phase failed, for operators.
ALTER TABLE {{schema}}.idempotency_keys
    ALTER COLUMN status DROP NOT NULL,
    ALTER COLUMN headers DROP NOT NULL,
    ALTER COLUMN body DROP NOT NULL,
    ADD COLUMN flow text,
    ADD COLUMN run_id text,
    ADD COLUMN recovery_point text,
    ADD COLUMN state bytea,
    ADD COLUMN lease_token text,
    ADD COLUMN lease_until timestamptz,
    ADD COLUMN taken integer NOT NULL DEFAULT 0,
    ADD COLUMN last_error text,
    ADD CONSTRAINT idempotency_keys_completed_or_running CHECK (
        (status IS NOT NULL AND headers IS NOT NULL AND body IS NOT NULL
            AND lease_until IS NULL AND lease_token IS NULL)
        OR (status IS NULL AND flow IS NOT NULL AND run_id IS NOT NULL AND recovery_point IS NOT NULL
            AND lease_until IS NOT NULL AND lease_token IS NOT NULL));

-- The recovery sweep's search: a flow's runs whose lease ran out.
CREATE INDEX idempotency_keys_runs_idx ON {{schema}}.idempotency_keys (flow, lease_until) WHERE status IS NULL;
