-- 011: idempotency keys of HTTP requests (package idempotency).
--
-- One row per (scope, key) whose request ended with a response its handler
-- decided (2xx, 4xx). The row is written in the transaction that wrote the
-- request's own rows, so it exists exactly when they do: a crash leaves
-- both or neither. A request still running holds an advisory lock on its
-- key instead of a row, which the server drops with the transaction: there
-- is nothing to clean up after a crash, and a retry starts afresh.
--
-- fingerprint: SHA-256 of the method, the route, the body and the headers
-- the API names; a retry must match it, or it is refused (422).
-- status, headers, body: the response, replayed byte for byte (headers as
-- "Name: value" lines, which HTTP header values cannot break).
-- expires_at: after it the key is free again, and pruning deletes the row.
CREATE TABLE {{schema}}.idempotency_keys (
    scope        text        NOT NULL,
    idem_key     text        NOT NULL,
    method       text        NOT NULL,
    route        text        NOT NULL,
    fingerprint  bytea       NOT NULL,
    status       integer     NOT NULL,
    headers      bytea       NOT NULL,
    body         bytea       NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    expires_at   timestamptz NOT NULL,
    PRIMARY KEY (scope, idem_key)
);

CREATE INDEX idempotency_keys_expires_idx ON {{schema}}.idempotency_keys (expires_at);
