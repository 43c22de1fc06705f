-- Priorities and concurrency limits (#16).
--
-- order_at is the ordering key of discovery and the claim: run_at moved earlier by the
-- task's head start (priority x SLOTD_PRIORITY_STEP, stamped by the producer at enqueue).
-- Every statement that moves run_at moves order_at by the same amount, so the head start
-- is a property of the row (order_at - run_at), not of whoever rewrites it later.
-- During a rolling upgrade, rows written by older producers get order_at = now() (the
-- default): their delay then counts as a head start once due, for those rows only.
ALTER TABLE slotd_tasks
    ADD COLUMN priority smallint NOT NULL DEFAULT 0 CHECK (priority BETWEEN -100 AND 100),
    ADD COLUMN task_group text,
    ADD COLUMN order_at timestamptz;
UPDATE slotd_tasks SET order_at = run_at;
ALTER TABLE slotd_tasks ALTER COLUMN order_at SET DEFAULT now(),
                        ALTER COLUMN order_at SET NOT NULL;

-- One ordering key, one partial index: it replaces slotd_tasks_due (run_at, id). run_at
-- is carried so "is it due yet?" is answered from the index alone.
CREATE INDEX slotd_tasks_order ON slotd_tasks (order_at, id)
    INCLUDE (task_type, run_at, lease_expires_at)
    WHERE attempt_count < max_attempts;
DROP INDEX slotd_tasks_due;

-- Live leases per type and per (type, group): what a limited claim counts. Same rows as
-- before (only leased ones, a handful), one more key column.
CREATE INDEX slotd_tasks_leased_group ON slotd_tasks (task_type, task_group)
    INCLUDE (lease_expires_at)
    WHERE lease_token IS NOT NULL;
DROP INDEX slotd_tasks_leased;

-- What each replica declares about its limited types ({"type": [max_running,
-- max_running_per_group]}), for `slotd status` and the gauges, which have no registry.
ALTER TABLE slotd_replicas ADD COLUMN limits jsonb NOT NULL DEFAULT '{}'::jsonb;
