-- 024: pauses that end by themselves.
--
-- until is when the pause stops holding (NULL: until it is resumed). The
-- end is decided by this server's clock, in the statements that read the
-- pauses (WHERE until IS NULL OR until > now()), so every member and
-- every tool agrees on it whatever the clocks of their machines say: a
-- member resumes a partition at its first read of the pauses after the
-- end. A pause written for a duration takes its end from the same clock
-- (now() + the duration). A row past its end is lifted: the next pause of
-- its scope replaces it.
ALTER TABLE {{schema}}.pauses ADD COLUMN until timestamptz;
ALTER TABLE {{schema}}.pauses ADD CHECK (until IS NULL OR until > paused_at);
