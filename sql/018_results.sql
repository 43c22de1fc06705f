-- Stored results (registry.handler(..., keep_result=timedelta)). A succeeded task's row is
-- deleted as before; a type that keeps results writes its return value here in the same
-- fenced statement that deletes it (sql `dequeue_keep`), so a worker that lost its lease
-- can never write one. Only rows of such types ever land here: plain tasks never touch it.
-- Additive: replicas of 0.1.0 never read it and go on deleting their tasks as they did.
-- No foreign key: the task row is gone by the time its result exists.
CREATE TABLE IF NOT EXISTS slotd_results (
    task_id      bigint      PRIMARY KEY,
    task_type    text        NOT NULL,
    value        jsonb,
    succeeded_at timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL
);

-- The retention chore's prune: expired results, oldest first.
CREATE INDEX IF NOT EXISTS slotd_results_expires ON slotd_results (expires_at);
