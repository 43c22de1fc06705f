-- Expand: terminal states, explicit (slotd/lifecycle.py, "dead letters"): why a task stopped
-- and how many attempts it really ran, written by the statement that makes it a dead letter.
--   dead_reason: 'exhausted' (out of attempts), 'cancelled' (an operator), and the ones this
--     round adds: 'expired', 'parent_failed'. NULL while the task is live.
--   dead_attempts: the attempts it ran, at the moment it stopped.
-- Expand only. Being dead is still `attempt_count >= max_attempts` for this release: replicas
-- of 0.1.0 claim by that comparison and their indexes are partial on it, so a cancel (and
-- every terminal state but exhaustion) still raises attempt_count to the threshold, and
-- dead_attempts keeps the real count that raise overwrites. The contract step (a later
-- release, once no 0.1.0 replica is alive) makes dead_reason the definition and stops the
-- raise. A reader shows a dead letter's reason as coalesce(dead_reason, inferred): rows made
-- dead by 0.1.0 replicas, or by a lease that lapsed on its final attempt with nobody left to
-- settle it, carry none.
ALTER TABLE slotd_tasks ADD COLUMN IF NOT EXISTS dead_reason text,
                        ADD COLUMN IF NOT EXISTS dead_attempts integer;

-- The dead letters already kept: their reason from the cancel stamp, and a cancelled one's
-- real count from the line its cancel wrote ("after N attempt(s)", "while attempt N was
-- running"). Dead letters are few (retention prunes them); this is one pass.
UPDATE slotd_tasks t
SET dead_reason = CASE WHEN t.cancelled_at IS NOT NULL THEN 'cancelled' ELSE 'exhausted' END,
    dead_attempts = CASE
        WHEN t.cancelled_at IS NULL THEN t.attempt_count
        ELSE coalesce(substring(t.last_error FROM 'after (\d+) attempt')::int,
                      substring(t.last_error FROM 'while attempt (\d+) was running')::int)
    END
WHERE t.attempt_count >= t.max_attempts AND t.dead_reason IS NULL
  AND (t.lease_expires_at IS NULL OR t.lease_expires_at <= now());
