-- 019: the store's identity, which the consumer's Kafka offset commits name.
--
-- The stored position of a partition is the truth, the group's committed
-- offset a copy. When a partition has no stored position the consumer
-- adopts the group's offset: it cannot tell a consumer new to this
-- database, taking a group over from another client, from a database that
-- lost the partition's rows (restored from a backup taken before the
-- partition's first start, or a row deleted). Adopting in the second case
-- passes over every message whose effects the restore rolled back.
--
-- So each schema gets one random id here, made once, by this migration.
-- The consumer writes it, with its name and the partition's first start,
-- into the metadata of every offset commit (see internal/commitmark). A
-- restore of the database brings this row back with the rest, so a group
-- offset that names this id while the partition has no stored position
-- means this database lost the row, and processing starts again from the
-- first start the commit names. A fresh database (migrated anew) gets an id
-- of its own, and treats the group's offset as it always did.
--
-- The id is made from random() and the clock rather than gen_random_uuid(),
-- which needs PostgreSQL 13; nothing here needs more than 12. Exactly one
-- row: the unique index on a constant refuses a second.
CREATE TABLE {{schema}}.store_identity (
    id         uuid        PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX store_identity_one_row ON {{schema}}.store_identity ((true));

INSERT INTO {{schema}}.store_identity (id)
VALUES (md5(random()::text || clock_timestamp()::text || pg_backend_pid()::text)::uuid);
