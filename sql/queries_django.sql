-- Statements of the Django integration (slotd.contrib.django), run through
-- slotd.repository.execute. The queue predicates of queries.sql are spliced in as {name}.

-- name: django_result_insert
-- enqueued_at is the moment of the enqueue, not the start of the caller's transaction
-- (now()): an enqueue late in a long atomic block is not back-dated.
INSERT INTO slotd_django_results
    (id, task_id, backend, queue_name, task_path, priority, takes_context, run_after,
     args, kwargs, enqueued_at)
VALUES (%(id)s, %(task_id)s, %(backend)s, %(queue_name)s, %(task_path)s, %(priority)s,
        %(takes_context)s, %(run_after)s, %(args)s::jsonb, %(kwargs)s::jsonb,
        clock_timestamp())
RETURNING enqueued_at

-- name: django_defer
-- run_after is an absolute time: stamp it exactly rather than trust the delay computed
-- on the caller's clock (the delay still decides whether the wake is sent).
UPDATE slotd_tasks t SET run_at = %(run_at)s, order_at = %(run_at)s - {head_start}
WHERE t.id = %(id)s

-- name: django_result_lock
-- Every transition is check-then-act in Python, so it holds the row for the whole step:
-- two deliveries of one task (a lapsed lease) take turns instead of interleaving.
SELECT r.status FROM slotd_django_results r WHERE r.id = %(id)s FOR UPDATE

-- name: django_result_reset
-- A redelivery of a FAILED task is a retry: back to READY before it starts again.
UPDATE slotd_django_results r
SET status = 'READY', finished_at = NULL, return_value = NULL
WHERE r.id = %(id)s AND r.status = 'FAILED'

-- name: django_result_running
-- started_at is the first attempt's start (Django's meaning); last_attempted_at this one's.
-- Found RUNNING, the attempt before never wrote its end (killed at its deadline, its runner
-- crashed, its lease lapsed): its error is recorded now, in the queue row's words, under
-- that attempt's number (get_result prefers slotd_attempts' record of it, when there is one).
UPDATE slotd_django_results r
SET status = 'RUNNING', started_at = coalesce(r.started_at, now()), last_attempted_at = now(),
    worker_ids = r.worker_ids || %(worker_id)s::text,
    errors = CASE
        WHEN r.status = 'RUNNING' THEN r.errors || jsonb_build_array(jsonb_build_object(
            'exception_class_path', %(lost_class)s::text,
            'traceback', coalesce(
                (SELECT t.last_error FROM slotd_tasks t WHERE t.id = r.task_id),
                'the attempt ended without recording its end'),
            'attempt', %(attempt)s::int - 1))
        ELSE r.errors
    END
WHERE r.id = %(id)s AND r.status IN ('READY', 'RUNNING')

-- name: django_result_rerun
-- SUCCESSFUL is sticky: a redelivery runs the function again but only leaves a trace.
UPDATE slotd_django_results r
SET last_attempted_at = now(), worker_ids = r.worker_ids || %(worker_id)s::text
WHERE r.id = %(id)s AND r.status = 'SUCCESSFUL'

-- name: django_result_succeed
UPDATE slotd_django_results r
SET status = 'SUCCESSFUL', finished_at = now(), return_value = %(return_value)s::jsonb
WHERE r.id = %(id)s AND r.status <> 'SUCCESSFUL'

-- name: django_result_fail
-- Django's FAILED is final (is_finished, finished_at, task_finished): a failed attempt
-- with another to come leaves the result READY, its error kept. Final when the worker says
-- so (%(final)s true: not retried), else when the queue row is on its last attempt or gone.
-- %(final)s false: released at shutdown, READY whatever the count (the row says the rest).
-- On a SUCCESSFUL record (a re-run that failed) the error is kept but the status is not.
WITH last AS (
    SELECT coalesce(%(final)s::boolean, NOT EXISTS (
        SELECT 1 FROM slotd_django_results x JOIN slotd_tasks t ON t.id = x.task_id
        WHERE x.id = %(id)s AND t.attempt_count < t.max_attempts
    )) AS final
)
UPDATE slotd_django_results r
SET status = CASE
        WHEN r.status = 'SUCCESSFUL' THEN r.status
        WHEN last.final THEN 'FAILED'
        ELSE 'READY'
    END,
    finished_at = CASE
        WHEN r.status = 'SUCCESSFUL' THEN r.finished_at
        WHEN last.final THEN now()
    END,
    errors = r.errors || jsonb_build_array(%(error)s::jsonb)
FROM last
WHERE r.id = %(id)s
RETURNING r.status

-- name: django_result_get
-- The stored record, corrected by the queue row for the attempts whose handler never got
-- to write their end: killed at the deadline, runner crashed, never started. Such a row is
-- READY again while it has attempts left (not under a live lease) and FAILED once it is a
-- dead letter or gone (a purged dead letter: a finished task's row is only deleted after
-- its record says SUCCESSFUL).
SELECT r.id, r.task_id, r.backend, r.queue_name, r.task_path, r.priority, r.takes_context,
       r.run_after, r.args, r.kwargs, r.status AS stored_status,
       CASE
           WHEN r.status NOT IN ('READY', 'RUNNING') THEN r.status
           WHEN t.id IS NULL THEN 'FAILED'
           WHEN {dead} THEN 'FAILED'
           WHEN r.status = 'RUNNING' AND NOT {lease_live} THEN 'READY'
           ELSE r.status
       END AS status,
       r.enqueued_at, r.started_at,
       coalesce(r.finished_at, CASE WHEN t.id IS NULL OR {dead}
                                    THEN coalesce(t.last_attempted_at, r.last_attempted_at)
                               END) AS finished_at,
       r.last_attempted_at, r.return_value, r.errors, r.worker_ids,
       t.id IS NOT NULL AS queued, t.last_error AS queue_error
FROM slotd_django_results r
LEFT JOIN slotd_tasks t ON t.id = r.task_id
WHERE r.id = %(id)s

-- name: django_results_prune
-- Retention, in batches: results finished before the window, and results that never
-- finished whose queue row is gone (a purged dead letter) and that are as old.
DELETE FROM slotd_django_results r
WHERE r.id IN (
    (SELECT f.id FROM slotd_django_results f
     WHERE f.finished_at IS NOT NULL
       AND f.finished_at < now() - make_interval(secs => %(retention_s)s)
     ORDER BY f.finished_at LIMIT %(batch)s)
    UNION ALL
    (SELECT u.id FROM slotd_django_results u
     WHERE u.finished_at IS NULL
       AND u.enqueued_at < now() - make_interval(secs => %(retention_s)s)
       AND NOT EXISTS (SELECT 1 FROM slotd_tasks t WHERE t.id = u.task_id)
     ORDER BY u.enqueued_at LIMIT %(batch)s))
