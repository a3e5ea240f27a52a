-- 025: who recorded a consumer's settings.
--
-- settings_recorded_by names the worker that wrote the record (its host,
-- process id and static instance id, if any), so that an operator who
-- finds the tools reading unexpected settings can tell which worker wrote
-- them. NULL for a record written before this migration.
ALTER TABLE {{schema}}.consumers ADD COLUMN settings_recorded_by text;
