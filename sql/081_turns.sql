-- Fair turns (#39): @registry.handler(..., fair=True) makes a type's groups take turns for
-- its slots, the group that started least recently first. When each group of a fair type
-- last started a task: stamped by the claim (sql `claim_fair`), read by the discovery
-- (`discover_fair`), pruned by the retention chore. A group without one never started.
-- Expand only: a new table; replicas of the previous release neither read nor write it
-- (they claim a fair type's tasks in plain order).
CREATE TABLE IF NOT EXISTS slotd_turns (
    task_type  text NOT NULL,
    task_group text NOT NULL,
    started_at timestamptz NOT NULL,
    PRIMARY KEY (task_type, task_group)
);
CREATE INDEX IF NOT EXISTS slotd_turns_started ON slotd_turns (started_at);
CREATE INDEX IF NOT EXISTS slotd_turns_last ON slotd_turns (task_type, started_at);

-- A type's groups with live rows, in name order, and each group's rows in delivery order:
-- the fair discovery's loose scan over groups (one descent per group). Partial on grouped
-- live rows: an ungrouped task never enters it; a grouped one of any type does (the index
-- cannot know which types are fair): one more index entry per grouped enqueue.
CREATE INDEX IF NOT EXISTS slotd_tasks_fair ON slotd_tasks (task_type, task_group, order_at, id)
    WHERE task_group IS NOT NULL AND attempt_count < max_attempts;
