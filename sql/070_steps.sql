-- Durable steps (#38): ctx.step(name, fn) stores fn's JSON value on the task's own row,
-- fenced on the lease (sql `record_step`), and the claim hands them back, so a later attempt
-- (a retry, a runner's crash, a slot's kill -9, a rollout) gets the value without calling
-- fn again. On the row itself, not a table of their own: they are pruned with the task by
-- whatever deletes it (a success's dequeue, retention, `dead purge`) at no cost, and a task
-- that takes no step pays one NULL in its row's null bitmap and nothing in its statements.
-- A JSON array of {"name", "value", "at"} in the order the steps ran.
-- Expand only: replicas of the previous release neither read nor write it.
ALTER TABLE slotd_tasks ADD COLUMN IF NOT EXISTS steps jsonb;
