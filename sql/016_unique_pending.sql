-- Uniqueness by state (#25): unique="pending" dedupes only against a task that has not
-- started; a running one lets a new task with the same key queue behind it.
--
-- The dedupe stays where it is: slotd_tasks_live_key, the unique index on (task_type, key)
-- over live rows (001), which the ON CONFLICT clause of every release's enqueue names, so it
-- is neither replaced nor changed. A row enqueued with unique="pending" gives its key up
-- when it is first claimed: the claim moves it from `key` to `started_key` in the same
-- UPDATE that takes the lease, and that row leaves the index. So the index holds a pending
-- row's key and never a started one's: "at most one pending task per key" is enforced by
-- the index itself, with no window between a look-up and an insert. An enqueue racing the
-- claim of the pending row either meets it still pending (it then locks the row FOR SHARE
-- until its transaction commits, and the claim, FOR UPDATE SKIP LOCKED, passes it by, so
-- the task starts after the enqueuing transaction and sees what it wrote) or waits for the
-- claim's commit and inserts its own row beside the started one.
--
-- A started row keeps its key in started_key (Task.key, `cancel --key`, the dead letter
-- listing read it there). A 0.1.0 replica claiming such a row does not move its key: the
-- running row then dedupes like a unique="live" one until it settles.
ALTER TABLE slotd_tasks
    ADD COLUMN unique_pending boolean NOT NULL DEFAULT false,
    ADD COLUMN started_key text;

-- `cancel --key` and the dead letter search find started rows by their key too.
CREATE INDEX slotd_tasks_started_key ON slotd_tasks (task_type, started_key)
    WHERE started_key IS NOT NULL;
