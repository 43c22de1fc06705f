-- Tags (#40): enqueue(..., tags=[...]) labels a task so slotd.tasks(tag=...), `slotd tasks
-- --tag` and the dashboard find a tenant's or a request's tasks. Expand only: replicas of
-- the previous release neither read nor write it (their enqueue leaves it NULL).
ALTER TABLE slotd_tasks ADD COLUMN IF NOT EXISTS tags text[];

-- Found by containment (tags @> ARRAY[tag]); only tagged rows are in it, so a queue that
-- never tags keeps an empty index and its enqueue pays nothing for it.
CREATE INDEX IF NOT EXISTS slotd_tasks_tags ON slotd_tasks USING gin (tags)
    WHERE tags IS NOT NULL;
