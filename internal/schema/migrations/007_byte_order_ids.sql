-- 007: claims keyed in byte order.
--
-- Every claim inserts into the primary key (consumer, message_id), and each
-- insert compares its key with a dozen others on the way down the B-tree.
-- With the database's collation those comparisons go through the locale
-- (strcoll, or ICU): in a database whose collation is ICU's en-US a claim
-- of 1,000 ids cost about a third more than with plain byte comparisons
-- (docs/design.md, "Ids compared as bytes"). Ids are opaque: their order
-- only has to be the same for everyone, and equality is the same either way
-- (a deterministic collation never calls two different strings equal). So
-- the key columns compare as bytes, whatever the database's collation.
--
-- The claim statements sort their ids in the same order (COLLATE "C"), so
-- that concurrent claims take their row locks in one order.
--
-- Changing a column's collation rewrites its indexes, not the table: on a
-- large processed_messages this holds an exclusive lock on the table while
-- the primary key and the age index are rebuilt. Run it while the workers
-- are stopped or quiet.
ALTER TABLE {{schema}}.processed_messages
    ALTER COLUMN consumer   TYPE text COLLATE "C",
    ALTER COLUMN message_id TYPE text COLLATE "C";
