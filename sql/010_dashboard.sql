-- The dashboard's outcome chart: attempts by minute, type and outcome. Metrics are
-- per-process counters, so without this the last hour of outcomes would exist only in
-- Prometheus. Each supervisor adds what its slots reported since its last heartbeat (one
-- upsert per heartbeat, none when idle) and prunes minutes older than two hours, so the
-- table stays at most 120 minutes x types x outcomes rows.
CREATE TABLE slotd_outcomes (
    minute    timestamptz NOT NULL,
    task_type text        NOT NULL,
    outcome   text        NOT NULL,
    count     bigint      NOT NULL,
    PRIMARY KEY (minute, task_type, outcome)
);

-- Per-type views of live work (the dashboard's capped pending counts, the per-type oldest
-- due, listing the types that have work at all by a loose index scan): the due index is
-- ordered by time across all types, so a quiet type's rows could only be found by reading
-- everyone else's. The same index as per-type discovery's (same name and definition, so
-- whichever migration runs first creates it and the other finds it there).
CREATE INDEX IF NOT EXISTS slotd_tasks_due_by_type ON slotd_tasks (task_type, run_at, id)
    INCLUDE (lease_expires_at)
    WHERE attempt_count < max_attempts;

-- The dead-letter list, newest first (the dashboard's and `slotd dead list`'s order: when
-- each stopped), read from an index instead of sorting every dead letter: 600,000 of them
-- took 400 ms to sort, per page load. One index for all types, one per type. Only rows at
-- the attempt threshold enter them, so enqueue, claim and settle never touch them.
CREATE INDEX slotd_tasks_dead_recent
    ON slotd_tasks ((coalesce(cancelled_at, last_attempted_at)) DESC NULLS LAST, id DESC)
    WHERE attempt_count >= max_attempts;
CREATE INDEX slotd_tasks_dead_recent_by_type
    ON slotd_tasks (task_type, (coalesce(cancelled_at, last_attempted_at)) DESC NULLS LAST,
                    id DESC)
    WHERE attempt_count >= max_attempts;

-- Which slot of which replica holds which lease, as of that replica's last heartbeat
-- (task id -> slot number): the dashboard's "running now" names the holder.
ALTER TABLE slotd_replicas ADD COLUMN leases jsonb NOT NULL DEFAULT '{}'::jsonb;
