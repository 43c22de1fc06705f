-- The dashboard's history (slotd.history): what supervisors record of the queue over time
-- and what the dashboard and `slotd status` read back. Loaded with queries.sql.

-- name: recent_outcomes
-- Attempts of the last %(minutes)s minutes by type and outcome (slotd_outcomes keeps two
-- hours): how `slotd status` and the overview show a storm of lost or crashed attempts.
SELECT o.task_type, o.outcome, sum(o.count)::bigint AS count
FROM slotd_outcomes o
WHERE o.minute >= date_trunc('minute', now()) - make_interval(mins => %(minutes)s - 1)
GROUP BY o.task_type, o.outcome
ORDER BY o.task_type, o.outcome

-- name: dash_live_count
-- What a cancel of this type (and key) would take, before the operator confirms it: the
-- cancel statement's own {live} predicate, capped like every dashboard count; and how
-- many of those are running (their replicas will be told to stop them).
SELECT count(*), count(*) FILTER (WHERE c.running)
FROM (
    SELECT {running} AS running FROM slotd_tasks t
    WHERE t.task_type = %(task_type)s AND (%(key)s::text IS NULL OR t.key = %(key)s OR t.started_key = %(key)s)
      AND {live}
    LIMIT %(cap)s
) c

-- fragment: error_line
-- The last line of a stored error (a traceback's "ValueError: ..."): what the dead-letter
-- list shows, and what its error search matches the start of.
(regexp_match(rtrim(coalesce(t.last_error, ''), E' \n\t'), '[^\n]*$'))[1]

-- predicate: dead_search
-- The dead-letter page's filters, each off when its parameter is NULL: a type, ids, a key
-- (through slotd_tasks_key, hence the types it is looked up in).
((%(task_type)s::text IS NULL OR t.task_type = %(task_type)s)
 AND (%(ids)s::bigint[] IS NULL OR t.id = ANY(%(ids)s::bigint[]))
 AND (%(key)s::text IS NULL OR ((t.key = %(key)s OR t.started_key = %(key)s)
                                AND t.task_type = ANY(%(key_types)s::text[]))))

-- predicate: dead_after
-- After the cursor (when it stopped, id) of the previous page's last row, in the order of
-- slotd_tasks_dead_recent (an index condition: page 6,000 costs what page 1 does).
(%(after_id)s::bigint IS NULL
 OR ({retired_at}, t.id) < (%(after_at)s::timestamptz, %(after_id)s::bigint))

-- name: dash_dead_page
-- One page of dead letters, newest first (the order of slotd_tasks_dead_recent and its
-- per-type twin, sql/010), by keyset, never an OFFSET (which reads and throws away every
-- row before the page). A dead letter that never stopped (no attempt, no cancel) sorts
-- last, as NULLS LAST puts it; the second branch pages through those by id.
(SELECT t.id, t.task_type, {task_key} AS key, {attempts_made} AS attempt_count,
        t.last_attempted_at, t.cancelled_at, {dead_reason} AS dead_reason,
        {retired_at} AS retired_at, {error_line} AS error_line
 FROM slotd_tasks t
 WHERE {dead} AND {dead_search} AND {dead_after}
 ORDER BY {retired_at} DESC NULLS LAST, t.id DESC
 LIMIT %(limit)s)
UNION ALL
(SELECT t.id, t.task_type, {task_key} AS key, {attempts_made}, t.last_attempted_at,
        t.cancelled_at, {dead_reason}, NULL::timestamptz, {error_line}
 FROM slotd_tasks t
 WHERE {dead} AND {dead_search} AND {retired_at} IS NULL
   AND (%(after_id)s::bigint IS NULL OR %(after_at)s::timestamptz IS NOT NULL
        OR t.id < %(after_id)s::bigint)
 ORDER BY t.id DESC
 LIMIT %(limit)s)
LIMIT %(limit)s

-- name: dash_dead_errors
-- Dead letters whose error line starts with %(error)s (case-insensitive), newest first,
-- looked for among the next %(scan)s dead letters after the cursor only: no index knows
-- error text, so the search walks the listing's index for a bounded stretch and says
-- where it stopped (the last row, window_end), from where the next search goes on.
WITH scanned AS (
    SELECT t.id, t.task_type, {task_key} AS key, {attempts_made} AS attempt_count,
           t.last_attempted_at, t.cancelled_at, {dead_reason} AS dead_reason,
           {retired_at} AS retired_at, {error_line} AS error_line
    FROM slotd_tasks t
    WHERE {dead} AND {dead_search} AND {dead_after}
    ORDER BY {retired_at} DESC NULLS LAST, t.id DESC
    LIMIT %(scan)s
)
(SELECT s.*, false AS window_end, 0::bigint AS scanned FROM scanned s
 WHERE starts_with(lower(s.error_line), lower(%(error)s))
 ORDER BY s.retired_at DESC NULLS LAST, s.id DESC
 LIMIT %(limit)s)
UNION ALL
(SELECT s.*, true, (SELECT count(*) FROM scanned) FROM scanned s
 ORDER BY s.retired_at ASC NULLS FIRST, s.id ASC
 LIMIT 1)

-- name: dash_tasks_page
-- One page of live tasks in due order, after the cursor (run_at, id) of the previous page's
-- last row: a keyset, never an OFFSET. No index orders every type's rows by run_at (the
-- ordering indexes lead with the type, sql/011), so each live type (a loose index scan)
-- gives its first rows after the cursor from slotd_tasks_due_by_type and the page is the
-- first of those: types x the page size index entries at most, at any depth. A type, ids
-- or a key narrow it, as on the dead-letter page. A task waiting on its parents, an event
-- without a timeout or its sequence's turn (run_at infinity) comes last, shown with what it
-- waits on (wait_event, sequence_waiting) instead of a due time; a cursor without a time
-- is one.
WITH {live_types}
SELECT p.* FROM live_types l
CROSS JOIN LATERAL (
    SELECT t.id, t.task_type, {task_key} AS key, {shown_run_at}, t.attempt_count, t.max_attempts,
           t.priority, {running} AS running, t.cancelled_at IS NOT NULL AS cancelled,
           {task_state} AS state, t.wait_event, t.sequence_waiting, now() AS db_now
    FROM slotd_tasks t
    WHERE t.task_type = l.task_type AND {retryable}
      AND (%(ids)s::bigint[] IS NULL OR t.id = ANY(%(ids)s::bigint[]))
      AND (%(key)s::text IS NULL
           OR ((t.key = %(key)s OR t.started_key = %(key)s)
               AND t.task_type = ANY(%(key_types)s::text[])))
      AND (%(after_id)s::bigint IS NULL
           OR (t.run_at, t.id)
              > (coalesce(%(after_at)s::timestamptz, 'infinity'), %(after_id)s::bigint))
    ORDER BY t.run_at, t.id
    LIMIT %(limit)s
) p
WHERE l.task_type IS NOT NULL
  AND (%(task_type)s::text IS NULL OR l.task_type = %(task_type)s)
ORDER BY p.run_at NULLS LAST, p.id
LIMIT %(limit)s

-- name: history_sample
-- One minute's sample of the queue, per live type (a loose index scan finds the types):
-- pending (the gauges' definition), running, and the wait of its oldest claimable task
-- (what the starvation alert watches). Taken by the first replica to ask in a minute;
-- the others find the minute there and read nothing else. Minutes older than 25 hours
-- go in the same statement (the dashboard's last day by hour).
WITH {live_types},
fresh AS (
    SELECT date_trunc('minute', now()) AS minute
    WHERE NOT EXISTS (SELECT 1 FROM slotd_queue_history h
                      WHERE h.minute = date_trunc('minute', now()))
), pruned AS (
    DELETE FROM slotd_queue_history h
    WHERE h.minute < now() - interval '25 hours' AND EXISTS (SELECT 1 FROM fresh)
)
INSERT INTO slotd_queue_history AS h (minute, task_type, pending, running, oldest_due_s)
SELECT f.minute, l.task_type,
       (SELECT count(*) FROM slotd_tasks t WHERE t.task_type = l.task_type AND {retryable}),
       (SELECT count(*) FROM slotd_tasks t WHERE t.task_type = l.task_type AND {running}),
       (SELECT extract(epoch FROM now() - t.run_at)::float8 FROM slotd_tasks t
        WHERE t.task_type = l.task_type AND {claimable}
        ORDER BY t.run_at LIMIT 1)
FROM fresh f CROSS JOIN live_types l
WHERE l.task_type IS NOT NULL
ON CONFLICT (minute, task_type) DO NOTHING

-- name: dash_history
-- The backlog charts: the samples of the last %(buckets)s buckets (%(unit)s: minute or
-- hour), the current one included, each bucket's highest (a day by hour: the peak of each
-- hour's sixty samples). One type, or all with NULL. At most 1,500 minutes x types rows.
SELECT date_trunc(%(unit)s, h.minute) AS minute, h.task_type, max(h.pending) AS pending,
       max(h.running) AS running, max(h.oldest_due_s) AS oldest_due_s
FROM slotd_queue_history h
WHERE h.minute >= date_trunc(%(unit)s, now())
                  - (%(buckets)s - 1) * ('1 ' || %(unit)s)::interval
  AND (%(task_type)s::text IS NULL OR h.task_type = %(task_type)s)
GROUP BY 1, h.task_type
ORDER BY 1, h.task_type

-- name: replica_leases
-- Which slot holds which lease, between heartbeats: the chores thread writes it within
-- seconds of a change, so "running now" names the holder of a task shorter than a heartbeat.
UPDATE slotd_replicas SET leases = %(leases)s::jsonb WHERE replica_id = %(replica_id)s

-- name: dash_neighbours
-- A task's parents and dependants with each one's state ({task_state}), for its page's
-- graph: its row's state while it has one, else succeeded when the edge says so or a result is kept, else
-- gone (a purged dead letter). By the edges' two indexes, at most %(limit)s a side.
WITH e AS (
    (SELECT 'parent' AS side, d.parent_id AS id, d.parent_done AS done
     FROM slotd_dependencies d WHERE d.child_id = %(id)s ORDER BY d.parent_id LIMIT %(limit)s)
    UNION ALL
    (SELECT 'dependant', d.child_id, d.parent_done
     FROM slotd_dependencies d WHERE d.parent_id = %(id)s ORDER BY d.child_id LIMIT %(limit)s)
)
SELECT e.side, e.id, t.task_type,
       CASE WHEN t.id IS NOT NULL THEN {task_state}
            WHEN e.side = 'parent' AND e.done THEN 'succeeded'
            WHEN EXISTS (SELECT 1 FROM slotd_results r WHERE r.task_id = e.id) THEN 'succeeded'
            ELSE 'gone' END AS state
FROM e LEFT JOIN slotd_tasks t ON t.id = e.id
ORDER BY e.side DESC, e.id

-- name: dash_batch
-- One batch for its graph: its callback, and its members' ends by state as its stripes
-- counted them (at most 16 rows; a stripe keeps its counts once done).
SELECT b.id, b.callback_type, b.total, b.callback_id, b.created_at, b.sealed_at,
       b.completed_at,
       coalesce(sum(s.succeeded), 0)::int AS succeeded,
       coalesce(sum(s.failed), 0)::int AS failed,
       coalesce(sum(s.cancelled), 0)::int AS cancelled,
       coalesce(sum(s.expired), 0)::int AS expired,
       (SELECT {task_state} FROM slotd_tasks t WHERE t.id = b.callback_id) AS callback_state,
       EXISTS (SELECT 1 FROM slotd_results r WHERE r.task_id = b.callback_id) AS callback_kept
FROM slotd_batches b LEFT JOIN slotd_batch_stripes s ON s.batch_id = b.id
WHERE b.id = %(id)s
GROUP BY b.id

-- name: dash_batch_members
-- The batch's members that still have a row (live ones and dead letters; a succeeded one
-- is gone, counted by its stripe), by the batch index (sql/065), the first %(limit)s by id.
SELECT t.id, t.task_type, {task_state} AS state
FROM slotd_tasks t
WHERE t.batch_id = %(id)s
ORDER BY t.id
LIMIT %(limit)s

-- name: dash_task_kept
-- A task whose row is gone but whose success is kept (keep_result, keep_history, sql/018):
-- its type, when it succeeded, until when it is kept, whether its value is (a type that
-- keeps its history only stores none), and when its first remembered attempt started.
SELECT r.task_id AS id, r.task_type, r.succeeded_at, r.expires_at,
       r.value IS NOT NULL AS value_kept, now() AS db_now,
       (SELECT a.started_at FROM slotd_attempts a WHERE a.task_id = r.task_id
        ORDER BY a.id LIMIT 1) AS first_started_at
FROM slotd_results r
WHERE r.task_id = %(id)s AND r.expires_at > now()

-- name: dash_attempts
-- One page of a task's remembered attempts (sql/030), newest first, by keyset on the
-- attempts' own index (task_id, id): a task retried or snoozed 10,000 times is read
-- %(limit)s at a time, never whole. Each error is cut to %(error_chars)s characters (a
-- traceback is rarely longer; the page says when it was cut), its last line apart for
-- the folded view, taken from the error's end only.
SELECT a.id, a.number, a.outcome, left(a.error, %(error_chars)s) AS error,
       length(a.error) AS error_length,
       (regexp_match(rtrim(right(a.error, 2000), E' \n\t'), '[^\n]*$'))[1] AS error_line,
       a.started_at, a.ended_at, a.host, a.pid, a.slot
FROM slotd_attempts a
WHERE a.task_id = %(id)s AND (%(before)s::bigint IS NULL OR a.id < %(before)s::bigint)
ORDER BY a.id DESC
LIMIT %(limit)s

-- name: dash_attempt_count
-- How many attempts a task has remembered, up to the cap (an index-only count).
SELECT count(*) FROM (
    SELECT 1 FROM slotd_attempts a WHERE a.task_id = %(id)s LIMIT %(cap)s
) c

-- name: dash_steps
-- One page of a task's durable steps (sql/070: a JSON array on its row, in the order they
-- ran), from step %(from)s (0-based) on: the slice is cut in one jsonpath call, so the row's
-- array is read once whatever its length, and only the page's steps are unpacked. Each
-- step's name, when it was stored, and its value's size (bytes of its JSON text): never the
-- value itself, which may be large and is the handler's data.
SELECT %(from)s::int + s.n::int AS number, s.step ->> 'name' AS name,
       (s.step ->> 'at')::timestamptz AS at, octet_length((s.step -> 'value')::text) AS size
FROM slotd_tasks t
CROSS JOIN LATERAL jsonb_array_elements(
    jsonb_path_query_array(coalesce(t.steps, '[]'::jsonb), '$[$from to $to]',
                           jsonb_build_object('from', %(from)s::int,
                                              'to', %(from)s::int + %(limit)s::int - 1))
) WITH ORDINALITY AS s(step, n)
WHERE t.id = %(id)s
ORDER BY s.n

-- name: dash_find
-- The tasks page's search by state or tag (live tasks and dead letters alike), newest
-- first by id, after the cursor (the previous page's last id). A tag is looked up through
-- slotd_tasks_tags (sql/040), an id or key through their indexes, inside the walk; a state
-- ({task_state}, derived: no index knows it) and a type only filter what the walk read: it
-- reads at most %(scan)s rows newest first (the primary key, backwards) and its last row
-- (window_end) says where it stopped, from where the next search goes on. Bounded at any
-- size: a state that only old tasks are in takes several pages to reach, never a read of
-- the whole table.
WITH scanned AS (
    SELECT t.id, t.task_type, {task_key} AS key, {shown_run_at},
           {attempts_made} AS attempt_count, t.max_attempts, t.priority, t.tags,
           {task_state} AS state, {running} AS running, t.cancelled_at IS NOT NULL AS cancelled,
           t.created_at, now() AS db_now
    FROM slotd_tasks t
    WHERE (%(after_id)s::bigint IS NULL OR t.id < %(after_id)s::bigint)
      AND {tagged}
      AND (%(ids)s::bigint[] IS NULL OR t.id = ANY(%(ids)s::bigint[]))
      AND (%(key)s::text IS NULL
           OR ((t.key = %(key)s OR t.started_key = %(key)s)
               AND t.task_type = ANY(%(key_types)s::text[])))
    ORDER BY t.id DESC
    LIMIT %(scan)s
)
(SELECT s.*, false AS window_end, 0::bigint AS scanned FROM scanned s
 WHERE (%(state)s::text IS NULL OR s.state = %(state)s)
   AND (%(task_type)s::text IS NULL OR s.task_type = %(task_type)s)
 ORDER BY s.id DESC
 LIMIT %(limit)s)
UNION ALL
(SELECT s.*, true, (SELECT count(*) FROM scanned) FROM scanned s
 ORDER BY s.id ASC
 LIMIT 1)

-- name: dash_kept_page
-- The tasks page's search for succeeded tasks: those whose success is kept (keep_result,
-- keep_history; sql/018), newest first by id, walked as dash_find walks (at most %(scan)s
-- kept results after the cursor, the type filtered among them; the last row, window_end,
-- says where it stopped). An id, a type, a key or a tag finds them: the key and tags are
-- stored beside the result (sql/091; a result kept by a replica of the previous release
-- has neither). A tag is looked up through slotd_results_tags, a key through
-- slotd_results_key, inside the walk, as dash_find does on the queue.
WITH scanned AS (
    SELECT r.task_id AS id, r.task_type, r.succeeded_at, r.expires_at,
           r.value IS NOT NULL AS value_kept, r.key, r.tags
    FROM slotd_results r
    WHERE r.expires_at > now()
      AND (%(after_id)s::bigint IS NULL OR r.task_id < %(after_id)s::bigint)
      AND (%(ids)s::bigint[] IS NULL OR r.task_id = ANY(%(ids)s::bigint[]))
      AND (%(tag)s::text IS NULL OR (r.tags IS NOT NULL AND r.tags @> ARRAY[%(tag)s::text]))
      -- Any type's key (a kept type may have no live row to be listed by): the index's
      -- leading column.
      AND (%(key)s::text IS NULL OR r.key = %(key)s)
    ORDER BY r.task_id DESC
    LIMIT %(scan)s
)
(SELECT s.*, false AS window_end, 0::bigint AS scanned FROM scanned s
 WHERE %(task_type)s::text IS NULL OR s.task_type = %(task_type)s
 ORDER BY s.id DESC
 LIMIT %(limit)s)
UNION ALL
(SELECT s.*, true, (SELECT count(*) FROM scanned) FROM scanned s
 ORDER BY s.id ASC
 LIMIT 1)
