-- 027: dead letters written before a share group record's last delivery.
--
-- A share group's broker archives a record after its last delivery
-- (group.share.delivery.count.limit) without a word, and a record whose
-- handler kills its process on every delivery never reaches a
-- transaction that could set it aside. A share group member therefore
-- writes the letter of a record on its last delivery first, in a
-- transaction of its own, marked provisional, and only then runs the
-- handler; the transaction that applies the record (or finds it claimed,
-- or sets it aside for good) removes the provisional letter. One that
-- stays is the letter of a record whose last delivery never finished: an
-- ordinary open letter, redriven or settled as any other.
ALTER TABLE {{schema}}.dead_letters
    ADD COLUMN provisional boolean NOT NULL DEFAULT false;
