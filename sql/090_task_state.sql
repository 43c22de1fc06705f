-- A task's state, defined in the database (#37): slotd_task_state(t) reads a slotd_tasks
-- row's state in slotd's one vocabulary (docs/ARCHITECTURE.md, "A task's states";
-- slotd/repository/states.py). Every reader of states calls it (sql/queries.sql, fragment
-- `task_state`: slotd.result, `slotd status`, slotd.tasks(state=), the dashboard, Django's
-- results), and so can an operator's own SQL:
--     SELECT slotd_task_state(t), count(*) FROM slotd_tasks t GROUP BY 1;
-- Additive: a new function; replicas of the previous release never call it.
--
-- Derived from the row, not stored: it reads only the columns every release writes
-- (attempt_count against max_attempts, the lease, dead_reason, cancelled_at, run_at =
-- 'infinity', expires_at, wait_step, sequence_waiting), so a row written by a replica of the
-- previous release during a rolling upgrade reads right at once, with no backfill and no
-- contract step; and three of its states (scheduled / retrying -> pending, running ->
-- lapsed, live -> expired) change with the clock alone, which no stored column follows
-- without a sweep rewriting rows.
--
-- A single SELECT of an expression, LANGUAGE sql, STABLE (now()), no SET clause: the
-- planner inlines it, so a statement calling it plans as if the CASE were written there
-- (tests/test_task_state_function.py pins that). In order:
--   failed / cancelled / expired  a dead letter nobody holds (by its dead_reason; a
--                                 dependant stopped by its parent's end is cancelled);
--   running                       under a live lease (a cancelled attempt too, until it
--                                 settles);
--   expired                       past its expires_at: it will never start, swept or not;
--   waiting                       on its parents (run_at = 'infinity', sql/019), on a
--                                 durable sleep or an event (wait_step, sql/072), or on
--                                 its sequence (sequence_waiting, sql/080);
--   retrying                      an attempt ran and failed, the next is due later;
--   scheduled                     not due yet, no attempt ran;
--   pending                       due, waiting for a slot.
-- succeeded has no row: it is read from slotd_results (sql/queries.sql, `result_of`).
-- A later change of a state is a new migration replacing this function (CREATE OR REPLACE
-- keeps its signature), applied before the release that relies on it starts.
CREATE OR REPLACE FUNCTION slotd_task_state(t slotd_tasks) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE
AS $fn$
SELECT CASE
    WHEN t.attempt_count >= t.max_attempts
         AND NOT (t.lease_expires_at IS NOT NULL AND t.lease_expires_at > now())
    THEN CASE coalesce(t.dead_reason, CASE WHEN t.cancelled_at IS NOT NULL THEN 'cancelled' END)
              WHEN 'expired' THEN 'expired'
              WHEN 'cancelled' THEN 'cancelled'
              WHEN 'parent_failed' THEN 'cancelled'
              ELSE 'failed' END
    WHEN t.lease_expires_at IS NOT NULL AND t.lease_expires_at > now() THEN 'running'
    WHEN NOT (t.expires_at IS NULL OR t.expires_at > now()) THEN 'expired'
    WHEN NOT isfinite(t.run_at) OR t.wait_step IS NOT NULL OR t.sequence_waiting THEN 'waiting'
    WHEN t.run_at > now() AND t.attempt_count > 0 THEN 'retrying'
    WHEN t.run_at > now() THEN 'scheduled'
    ELSE 'pending'
END
$fn$;

COMMENT ON FUNCTION slotd_task_state(slotd_tasks) IS
    'slotd: a task row''s state (scheduled, pending, running, retrying, waiting, failed, '
    'cancelled, expired); succeeded tasks have no row. See sql/090_task_state.sql.';
