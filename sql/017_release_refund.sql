-- A rollout never dead-letters a task by itself (slotd/lifecycle.py, "released").
-- An interruption costs an attempt (a task always mid-flight at rollout must not become
-- immortal), but a release at shutdown of a task on its final attempt gives that one attempt
-- back, once per task: this flag records that it has been given. Expand only: replicas of
-- 0.1.0 never read it and keep their own rule for the leases they release.
ALTER TABLE slotd_tasks ADD COLUMN IF NOT EXISTS final_attempt_refunded boolean NOT NULL DEFAULT false;
