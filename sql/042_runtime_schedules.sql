-- Runtime schedules (#40): slotd.put_schedule / delete_schedule and `slotd schedules
-- add|delete` keep schedules here, managed by the application at run time, beside the ones
-- declared in code (slotd_schedules, sql/006). A table of their own, so the two kinds can
-- never overwrite each other: a declaration in code writes only slotd_schedules, a put only
-- this table (and a put refuses a name a declared schedule's row holds, so operators never
-- see one name twice).
--
-- Firing does not evaluate every schedule on every replica: each row carries its next fire
-- time, and a replica's runtime-schedule thread takes only the due rows (the index below,
-- FOR UPDATE SKIP LOCKED, a batch at a time), computes each one's next fire time, and in the
-- same transaction inserts the task and advances the row (compare-and-set on the fire time
-- it read): exactly once across the fleet, with no leader. Additive: a new table; replicas
-- of the previous release never read it.
CREATE TABLE IF NOT EXISTS slotd_runtime_schedules (
    name         text        PRIMARY KEY,
    task_type    text        NOT NULL,
    -- A 5-field cron expression, or `every <seconds>s` (as slotd_schedules.expression).
    expression   text        NOT NULL,
    timezone     text        NOT NULL DEFAULT 'UTC',
    payload      jsonb       NOT NULL DEFAULT '{}'::jsonb,
    -- The next fire time not yet dealt with; the thread takes rows whose time has come.
    next_fire_at timestamptz NOT NULL,
    -- The latest fire time dealt with (enqueued, or folded into a task still live).
    last_fire_at timestamptz,
    -- The task the last fire enqueued: overlap "skip" asks whether it is still live.
    last_task_id bigint,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS slotd_runtime_schedules_due
    ON slotd_runtime_schedules (next_fire_at);
