-- The queue over the last hours, for the dashboard's backlog charts: per minute and type,
-- how many tasks were pending and running and how long the oldest due one had waited.
-- Sampled once a minute for the whole fleet by whichever replica's chores thread gets
-- there first (the primary key makes the others' sample a no-op) and pruned to six hours
-- in the same statement: at most 360 minutes x types rows, whatever the fleet's size.
CREATE TABLE slotd_queue_history (
    minute       timestamptz NOT NULL,
    task_type    text        NOT NULL,
    pending      bigint      NOT NULL,
    running      bigint      NOT NULL,
    oldest_due_s float8,
    PRIMARY KEY (minute, task_type)
);
