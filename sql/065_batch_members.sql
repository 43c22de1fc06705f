-- The dashboard draws a batch with its members (#44): the members that still have a row
-- (live ones and dead letters) are found by this index, a batch's own range, instead of
-- a read of the whole queue table. Partial: only rows of a batch carry an entry.
-- Building it reads the queue table once (a plain CREATE INDEX: writes wait meanwhile, as
-- for sql/011; `slotd migrate --lock-timeout` bounds the wait for its lock).
CREATE INDEX IF NOT EXISTS slotd_tasks_batch ON slotd_tasks (batch_id, id)
    WHERE batch_id IS NOT NULL;
