-- Dedupe looks a key up among ALL live rows, including those on their final attempt under a
-- lease, which the partial unique index leaves out; without this index that look-up was a
-- sequential scan of the table on every enqueue.
CREATE INDEX slotd_tasks_key ON slotd_tasks (task_type, key) WHERE key IS NOT NULL;
