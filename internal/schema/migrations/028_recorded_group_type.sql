-- 028: which kind of group a consumer's recorded group is.
--
-- settings_group_type is "consumer" or "share" (Config.GroupType), so that
-- the tools (status, the page) read a share group's members, settings and
-- share lag without being told. NULL for a record written before this
-- migration: a consumer group, which is all there was.
ALTER TABLE {{schema}}.consumers ADD COLUMN settings_group_type text;
