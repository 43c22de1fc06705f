-- Periodic schedules (Registry.schedule): one durable row per schedule name. A fire time
-- becomes a task only through the statement that advances last_fire_at with a
-- compare-and-set and inserts the task in the same transaction (schedules_fire in
-- sql/queries_schedules.sql), so the fleet needs no leader and a committed advance always
-- has its task.
CREATE TABLE slotd_schedules (
    name         text        PRIMARY KEY,
    task_type    text        NOT NULL,
    -- As declared, for operators and `slotd schedules`: a cron expression or `every Ns`.
    expression   text        NOT NULL,
    timezone     text        NOT NULL,
    catch_up     text        NOT NULL,
    -- The first fire is the first fire time after the row was created (database clock):
    -- a new schedule never back-fills.
    anchor_at    timestamptz NOT NULL DEFAULT now(),
    -- The latest fire time the fleet has dealt with (enqueued, folded or skipped).
    last_fire_at timestamptz,
    -- The task the last fire enqueued: the overlap rule asks whether it is still live.
    last_task_id bigint,
    -- When (database clock) that advance was written.
    fired_at     timestamptz
);

-- Which schedules each live replica declares, refreshed by its schedule thread, so that
-- `slotd schedules` can say who declares a schedule and show the ones nobody declares.
CREATE TABLE slotd_schedule_declarations (
    replica_id text        PRIMARY KEY,
    hostname   text        NOT NULL,
    pid        integer     NOT NULL,
    schedules  text[]      NOT NULL,
    seen_at    timestamptz NOT NULL DEFAULT now()
);
