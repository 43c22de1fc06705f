-- Operator control (#15): cancelled tasks and paused task types.

-- When an operator cancelled the row (NULL: never). The cancel itself raises attempt_count
-- to max_attempts, so a cancelled row is dead by the one definition the gauges, listing,
-- retention and retry already share, and leaves the discovery and dedupe indexes with no
-- index change; this column only says why, and when retention's clock starts for a task
-- that never ran. Nullable without a default: a catalog-only change, instant on a big table.
ALTER TABLE slotd_tasks ADD COLUMN cancelled_at timestamptz;

-- Paused task types, fleet-wide: the claim statement itself reads this table (one look per
-- statement), so every replica honours a pause, including replicas started after it.
CREATE TABLE slotd_paused_types (
    task_type  text        PRIMARY KEY,
    paused_at  timestamptz NOT NULL DEFAULT now(),
    until      timestamptz,            -- NULL: until resumed
    paused_by  text        NOT NULL    -- OS user@host of whoever paused it
);
