-- A kept success findable by its key and tags (#44 item 2): the settlement that stores a
-- result (keep_result, keep_history; sql/018) also stores the task's key and tags, which
-- went with its deleted row before, so the dashboard's search (state "succeeded" by key or
-- tag) finds it. Expand only: two nullable columns and two partial indexes. Replicas of the
-- previous release insert results naming their columns (task_id, task_type, value,
-- expires_at): their kept successes have no key or tags and are found by id or type only,
-- as before.
--
-- The indexes are built under a SHARE lock on slotd_results: kept settlements wait for the
-- build (2.4 s at a million kept results, each keyed and tagged: tests/bench/RESULTS.md);
-- plain tasks never touch this table.
ALTER TABLE slotd_results ADD COLUMN IF NOT EXISTS key text;
ALTER TABLE slotd_results ADD COLUMN IF NOT EXISTS tags text[];
CREATE INDEX IF NOT EXISTS slotd_results_key ON slotd_results (key, task_type)
    WHERE key IS NOT NULL;
CREATE INDEX IF NOT EXISTS slotd_results_tags ON slotd_results USING gin (tags)
    WHERE tags IS NOT NULL;
