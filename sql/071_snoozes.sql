-- Snoozes (#38): `raise slotd.Snooze(td)` puts a task back, due again after td, without
-- spending an attempt (sql `snooze` gives back the one its claim burnt). Counted here, so a
-- handler that snoozes for ever still ends: past the cap (slotd/lifecycle/, "snoozed") the
-- task is a dead letter saying so, instead of attempts that mean nothing (oban #476).
-- Expand only: a NOT NULL column with a constant default (no rewrite); replicas of the
-- previous release neither read nor write it.
ALTER TABLE slotd_tasks ADD COLUMN IF NOT EXISTS snoozes integer NOT NULL DEFAULT 0;
