-- Results of Django tasks (slotd.contrib.django). The queue row is deleted when a task
-- succeeds, so what Django's get_result() reports has to outlive it: one row per enqueued
-- Django task, written in the same transaction as its queue row, kept for a retention
-- window after it finishes. Unused (and empty) unless the Django backend is configured.
CREATE TABLE slotd_django_results (
    id                uuid        PRIMARY KEY,
    -- The slotd_tasks row that delivers it. No foreign key: that row is deleted on
    -- success and pruned as a dead letter, while the result must stay readable.
    task_id           bigint      NOT NULL,
    backend           text        NOT NULL,
    queue_name        text        NOT NULL,
    task_path         text        NOT NULL,
    priority          integer     NOT NULL DEFAULT 0,
    takes_context     boolean     NOT NULL DEFAULT false,
    run_after         timestamptz,
    args              jsonb       NOT NULL DEFAULT '[]'::jsonb,
    kwargs            jsonb       NOT NULL DEFAULT '{}'::jsonb,
    status            text        NOT NULL DEFAULT 'READY'
                      CHECK (status IN ('READY', 'RUNNING', 'SUCCESSFUL', 'FAILED')),
    enqueued_at       timestamptz NOT NULL DEFAULT now(),
    started_at        timestamptz,
    finished_at       timestamptz,
    last_attempted_at timestamptz,
    return_value      jsonb,
    errors            jsonb       NOT NULL DEFAULT '[]'::jsonb,
    worker_ids        text[]      NOT NULL DEFAULT '{}'
);

-- Retention: finished results, oldest first.
CREATE INDEX slotd_django_results_finished ON slotd_django_results (finished_at)
    WHERE finished_at IS NOT NULL;

-- Retention of results that never finished because their queue row was purged.
CREATE INDEX slotd_django_results_unfinished ON slotd_django_results (enqueued_at)
    INCLUDE (task_id)
    WHERE finished_at IS NULL;
