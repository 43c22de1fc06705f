-- Sequences (#39): enqueue(..., sequence="customer:7") runs a sequence's tasks one at a time,
-- across the fleet, in the order their enqueuing transactions committed.
--
-- How commit order is made the order: every enqueue into a sequence first takes its row
-- here (an upsert: a row lock held to the enqueuer's commit) and draws its place from
-- last_pos under that lock. A second enqueuer of the same sequence waits for the first
-- one's commit (or rollback) before it draws, so places are drawn in commit order; ids are
-- not (two producers draw ids from the shared sequence in any order). A caller in
-- REPEATABLE READ or SERIALIZABLE meets a serialization failure instead of a stale read.
--
-- A task is in its sequence from its enqueue until it ends; the sequence's head is its
-- member with the lowest place that has not ended. Every other member waits (sequence_waiting,
-- run_at = order_at = 'infinity': behind every discovery window, never claimable, so a
-- waiting member costs no claim or discovery anything). The statement that ends the head
-- (success, final failure, cancel, expiry, lapse, purge) makes the next member due, under the
-- same row lock taken by an earlier statement of its transaction (so that statement's snapshot
-- sees every member committed before it; sql `sequence_lock_task`). A head that ends failed
-- halts the sequence (halted_by) unless its handler says sequence_on_failure="continue":
-- its followers wait until `slotd sequences resume NAME` (slotd.resume_sequence) or a
-- `slotd dead retry` of it that then succeeds.
--
-- Expand only: nullable columns and a column with a constant default, a new table, a
-- partial index on rows of sequences only. Replicas of the previous release never claim a
-- waiting member (run_at 'infinity') and settle a head by their linked statements
-- (has_dependants is set on every member), which neither release nor halt: the next
-- replica of this release to end a member of the sequence moves it on.
ALTER TABLE slotd_tasks ADD COLUMN IF NOT EXISTS sequence text,
                        ADD COLUMN IF NOT EXISTS sequence_pos bigint,
                        ADD COLUMN IF NOT EXISTS sequence_waiting boolean NOT NULL DEFAULT false;

-- A sequence's members in order: the head is the first one not ended.
CREATE INDEX IF NOT EXISTS slotd_tasks_sequence ON slotd_tasks (sequence, sequence_pos)
    WHERE sequence IS NOT NULL;

CREATE TABLE IF NOT EXISTS slotd_sequences (
    name       text PRIMARY KEY,
    last_pos   bigint NOT NULL DEFAULT 0,
    -- The member whose failure halted the sequence (NULL: not halted), and when.
    halted_by  bigint,
    halted_at  timestamptz,
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS slotd_sequences_halted ON slotd_sequences (halted_at)
    WHERE halted_by IS NOT NULL;
