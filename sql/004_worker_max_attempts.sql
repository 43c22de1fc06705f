-- The dead-letter threshold belongs to the worker that runs a task: the claim stamps its
-- SLOTD_MAX_ATTEMPTS (or the handler's max_attempts) on the row, unless the producer asked
-- for a number explicitly at enqueue. This column says which rows did.
ALTER TABLE slotd_tasks ADD COLUMN max_attempts_explicit boolean NOT NULL DEFAULT false;

-- Rows enqueued before this migration: which stamps were explicit was never recorded. A
-- live row stamped with something other than the old default was almost certainly asked
-- for (max_attempts= or the producer's own SLOTD_MAX_ATTEMPTS), so it keeps its number;
-- rows stamped 20 take the claiming worker's threshold from their next claim on.
UPDATE slotd_tasks SET max_attempts_explicit = true
WHERE max_attempts <> 20 AND attempt_count < max_attempts;
