-- Which slotd each replica runs (#26): the version it was released as, for `slotd status`
-- and the dashboard, and the newest migration its code carries, which `slotd migrate`
-- compares with a contract step's `-- slotd: contract of NNN` before removing anything the
-- older replicas still use. Expand only: two nullable columns (no rewrite, instant on any
-- table); a replica of a release before this one inserts its heartbeat without them and
-- shows as NULL, which the contract guard counts as older than every contract step.
ALTER TABLE slotd_replicas ADD COLUMN version text, ADD COLUMN migration integer;
