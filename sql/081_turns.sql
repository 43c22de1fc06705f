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
