-- Dependencies (slotd.enqueue(..., after=[ids])). A dependant is an ordinary row that waits
-- with run_at = order_at = 'infinity': never claimable by any replica (0.1.0's claim too:
-- run_at <= now() is false), and at the far end of the discovery index, behind the scan's
-- window, so discovery never walks past it. The settlement of its last parent makes it due
-- in the same statement (sql `dequeue_linked`). Additive: new columns with defaults (no
-- table rewrite), a new table; replicas of 0.1.0 never read them.
ALTER TABLE slotd_tasks ADD COLUMN IF NOT EXISTS has_dependants boolean NOT NULL DEFAULT false;
ALTER TABLE slotd_tasks ADD COLUMN IF NOT EXISTS parents_left integer;

-- One row per (parent, dependant). `value`: the parent's return value, written by its
-- success (whether or not its type keeps results), read by the dependant's claim
-- (task.parent_results). Kept while the dependant exists; the retention chore prunes edges
-- whose dependant is gone.
CREATE TABLE IF NOT EXISTS slotd_dependencies (
    parent_id   bigint  NOT NULL,
    child_id    bigint  NOT NULL,
    parent_done boolean NOT NULL DEFAULT false,
    value       jsonb,
    PRIMARY KEY (parent_id, child_id)
);
CREATE INDEX IF NOT EXISTS slotd_dependencies_child ON slotd_dependencies (child_id);
