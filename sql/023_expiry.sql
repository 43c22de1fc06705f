-- Expiry (#25): expires_in= on enqueue. A task not started by expires_at never starts: the
-- claim's claimable predicate refuses it from that instant (by the database's clock), and
-- the expiry sweep (slotd/lifecycle.py, "expired") makes it a dead letter with dead_reason
-- 'expired' soon after, in batches, which takes it out of the discovery index: an expired
-- row is passed over at most until the next sweep, never walked again and again.
-- Expand only: replicas of 0.1.0 neither read nor write it (they would still start an
-- expired task: see README, Expiry).
ALTER TABLE slotd_tasks ADD COLUMN IF NOT EXISTS expires_at timestamptz;

-- The sweep's look: live rows that carry an expiry, soonest first. Only rows enqueued with
-- expires_in are in it, so a queue that never uses expiry keeps an empty index.
CREATE INDEX IF NOT EXISTS slotd_tasks_expiring ON slotd_tasks (expires_at)
    WHERE expires_at IS NOT NULL AND attempt_count < max_attempts;
