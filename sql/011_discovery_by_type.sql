-- Discovery per served type (#13). slotd_tasks_order (sql/008) was ordered by (order_at, id)
-- across every type, so a replica's discovery walked past every due row of the types it
-- does not serve (20k of them: milliseconds an idle discovery instead of a tenth of one),
-- and the planner, which cannot tell a type's share of the table, kept choosing that walk
-- even beside an index keyed by type. So the order index is replaced by one keyed by type
-- first, same columns carried, same partial predicate: each served type is one range scan
-- that stops at its first row past the ordering window, and the discover statement merges
-- them. The oldest-due gauge reads each live type's first row the same way (a loose scan
-- over task_type); `slotd status` and the dashboard read slotd_tasks_due_by_type (sql/010).
-- Rebuilding it reads the live rows once (a plain CREATE INDEX: writes wait meanwhile).
CREATE INDEX slotd_tasks_order_by_type ON slotd_tasks (task_type, order_at, id)
    INCLUDE (run_at, lease_expires_at)
    WHERE attempt_count < max_attempts;
DROP INDEX slotd_tasks_order;
