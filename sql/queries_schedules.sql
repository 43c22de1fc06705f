-- Periodic schedules: every statement about slotd_schedules and its declarations, loaded
-- with queries.sql by slotd/repository.py (predicates from there are spliced in as {name}).

-- name: schedules_declare
-- A replica's schedule thread, at start and every 30 s: create the rows it declares, record
-- which schedules it declares, and read what it must know to plan: each row's anchor and
-- last fire, whether the row holds this replica's declaration, and the database's clock.
-- A steady fleet (one declaration per name) writes no schedule row here.
--
-- Newest declaration wins. Each replica stamps its declarations with the database's clock
-- at its first declare (`stamp`, kept for the replica's life). A row holding another
-- declaration (another fingerprint) is rewritten with this one only when this one is newer,
-- when the row has no stamp (an older release wrote it), when no other live replica
-- declares what the row holds (its version is gone: the newest live one takes over, at its
-- next declare), or when the row carries this replica's fingerprint with other columns (an
-- older release rewrote them). So during a rolling deploy the new version's declaration
-- takes the row at its first declare and the old replicas stop firing; a rollback's fresh
-- replicas take it back the same way.
--
-- A rewrite that changes the fire times (expression or zone) restarts the schedule from now,
-- as a new schedule starts: no catch-up of fire times the new expression would have had
-- while the old one was in force. last_task_id stays: overlap "skip" still sees the old
-- expression's task while it is live.
WITH input AS (
    SELECT * FROM unnest(%(names)s::text[], %(types)s::text[], %(expressions)s::text[],
                         %(zones)s::text[], %(catch_ups)s::text[], %(fingerprints)s::text[])
        AS i(name, task_type, expression, timezone, catch_up, fingerprint)
), stamp AS (
    SELECT coalesce(%(stamp)s::timestamptz, now() + make_interval(secs => %(offset_s)s))
        AS declared_at
), upsert AS (
    INSERT INTO slotd_schedules AS s (name, task_type, expression, timezone, catch_up,
                                      anchor_at, fingerprint, declared_at)
    SELECT i.name, i.task_type, i.expression, i.timezone, i.catch_up,
           now() + make_interval(secs => %(offset_s)s), i.fingerprint, st.declared_at
    FROM input i CROSS JOIN stamp st
    ORDER BY i.name
    ON CONFLICT (name) DO UPDATE
    SET task_type = excluded.task_type, expression = excluded.expression,
        timezone = excluded.timezone, catch_up = excluded.catch_up,
        fingerprint = excluded.fingerprint, declared_at = excluded.declared_at,
        anchor_at = CASE WHEN (s.expression, s.timezone)
                              IS DISTINCT FROM (excluded.expression, excluded.timezone)
                         THEN excluded.anchor_at ELSE s.anchor_at END,
        last_fire_at = CASE WHEN (s.expression, s.timezone)
                                 IS DISTINCT FROM (excluded.expression, excluded.timezone)
                            THEN NULL ELSE s.last_fire_at END
    WHERE (s.fingerprint, s.task_type, s.expression, s.timezone, s.catch_up) IS DISTINCT FROM
          (excluded.fingerprint, excluded.task_type, excluded.expression, excluded.timezone,
           excluded.catch_up)
      AND (s.declared_at IS NULL
           OR excluded.declared_at > s.declared_at
           OR s.fingerprint = excluded.fingerprint
           OR NOT EXISTS (
               SELECT 1 FROM slotd_schedule_declarations r
               CROSS JOIN LATERAL unnest(r.schedules, r.fingerprints) AS x(name, fingerprint)
               WHERE r.replica_id <> %(replica_id)s
                 AND r.seen_at >= now() - interval '1 minute'
                 AND x.name = s.name AND x.fingerprint = s.fingerprint))
    RETURNING s.name, s.anchor_at, s.last_fire_at, s.fingerprint, s.task_type, s.expression,
              s.timezone, s.catch_up
), declared AS (
    INSERT INTO slotd_schedule_declarations AS r (replica_id, hostname, pid, schedules,
                                                  fingerprints)
    VALUES (%(replica_id)s, %(hostname)s, %(pid)s, %(names)s::text[], %(fingerprints)s::text[])
    ON CONFLICT (replica_id) DO UPDATE
    SET seen_at = now(), schedules = excluded.schedules, fingerprints = excluded.fingerprints
), pruned AS (
    DELETE FROM slotd_schedule_declarations WHERE seen_at < now() - interval '10 minutes'
), rows AS (
    -- A row another replica created after this statement's snapshot reads as NULL here; the
    -- caller declares again (a new statement sees it).
    SELECT i.*, u.name IS NOT NULL AS written, s.name IS NOT NULL AS found,
           CASE WHEN u.name IS NOT NULL THEN u.anchor_at ELSE s.anchor_at END AS anchor_at,
           CASE WHEN u.name IS NOT NULL THEN u.last_fire_at ELSE s.last_fire_at END
               AS last_fire_at,
           CASE WHEN u.name IS NOT NULL
                THEN (u.fingerprint, u.task_type, u.expression, u.timezone, u.catch_up)
                ELSE (s.fingerprint, s.task_type, s.expression, s.timezone, s.catch_up)
           END AS held,
           CASE WHEN u.name IS NOT NULL THEN u.expression ELSE s.expression END
               AS held_expression
    FROM input i
    LEFT JOIN upsert u ON u.name = i.name
    LEFT JOIN slotd_schedules s ON s.name = i.name
)
-- offset_s is 0 but in the pytest plugin's manual mode, whose clock is the frozen now()
-- plus the time advanced.
SELECT r.name, CASE WHEN r.written OR r.found THEN r.anchor_at END AS anchor_at,
       r.last_fire_at,
       r.held IS NOT DISTINCT FROM
           (r.fingerprint, r.task_type, r.expression, r.timezone, r.catch_up) AS ours,
       r.held_expression,
       (SELECT declared_at FROM stamp) AS stamp,
       now() + make_interval(secs => %(offset_s)s) AS db_now
FROM rows r

-- name: schedules_fire
-- Fire times become tasks. For each schedule the caller planned from the row's last fire
-- (`expected`), one compare-and-set: the row is locked, and only if its last fire is still
-- the expected one and the new one is not in the database's future is it advanced -- in the
-- same statement, so the same transaction, as the tasks are inserted. Two replicas, a stale
-- one, or one killed mid-statement can therefore never enqueue a fire time twice, and an
-- advance that committed always has its tasks. A refused schedule reports the row's current
-- last fire so the caller plans again from it, and whether the row still holds the caller's
-- declaration (its fingerprint and fire times: see schedules_declare); a replica whose
-- declaration another one replaced never fires it.
WITH due AS (
    SELECT * FROM unnest(%(names)s::text[], %(expected)s::timestamptz[],
                         %(new_last)s::timestamptz[], %(fingerprints)s::text[],
                         %(expressions)s::text[], %(zones)s::text[])
        AS d(name, expected, new_last, fingerprint, expression, timezone)
), cur AS MATERIALIZED (
    -- Locked in name order, so replicas firing overlapping sets queue instead of
    -- deadlocking; FOR UPDATE reads each row's latest committed version, newer than this
    -- statement's snapshot when another replica just advanced it.
    SELECT s.name, s.last_fire_at, s.last_task_id, c.declared, s.expression,
           (c.declared AND s.last_fire_at IS NOT DISTINCT FROM d.expected
            AND d.new_last <= now() + make_interval(secs => %(offset_s)s)) AS ours
    FROM slotd_schedules s
    JOIN due d ON d.name = s.name
    CROSS JOIN LATERAL (
        SELECT (s.fingerprint, s.expression, s.timezone)
               IS NOT DISTINCT FROM (d.fingerprint, d.expression, d.timezone) AS declared
    ) c
    ORDER BY s.name
    FOR UPDATE OF s
), planned AS (
    SELECT f.*, f.fire_at = max(f.fire_at) OVER (PARTITION BY f.name) AS newest
    FROM unnest(%(f_names)s::text[], %(f_at)s::timestamptz[], %(f_types)s::text[],
                %(f_payloads)s::jsonb[], %(f_keys)s::text[], %(f_skip_live)s::boolean[])
        AS f(name, fire_at, task_type, payload, key, skip_live)
), fires AS MATERIALIZED (
    -- The overlap rule "skip": at most one live task per schedule, whatever the stall. A
    -- fire whose schedule's previous task is still live (due, running or backing off)
    -- enqueues nothing, and of a batch of due fire times (late ones after a stall, or a
    -- catch-up) only the most recent is enqueued: the others fold into it, as a fire
    -- while its task is live would. The row advances past all of them all the same.
    SELECT f.name, f.fire_at, f.task_type, f.payload, f.key,
           nextval(pg_get_serial_sequence('slotd_tasks', 'id')) AS new_id
    FROM planned f
    JOIN cur c ON c.name = f.name AND c.ours
    WHERE NOT f.skip_live
       OR (f.newest AND NOT EXISTS (
               SELECT 1 FROM slotd_tasks t WHERE t.id = c.last_task_id AND {live}))
), ins AS (
    -- run_at is the fire time itself, not the moment of this write (manual mode: on the
    -- queue's frozen clock, like every row it moves back).
    -- Priority 0: ordered at its fire time (order_at = run_at).
    INSERT INTO slotd_tasks (id, task_type, payload, key, run_at, max_attempts, order_at)
    SELECT f.new_id, f.task_type, f.payload, f.key,
           f.fire_at - make_interval(secs => %(offset_s)s), %(max_attempts)s,
           f.fire_at - make_interval(secs => %(offset_s)s)
    FROM fires f
    ORDER BY f.name, f.fire_at
    ON CONFLICT (task_type, key) WHERE key IS NOT NULL AND attempt_count < max_attempts
    DO NOTHING
    RETURNING id
), enqueued AS (
    -- Per schedule, once: a correlated look-up per row would be quadratic in the batch.
    SELECT f.name, max(i.id) AS last_id, array_agg(i.id ORDER BY i.id) AS ids
    FROM ins i
    JOIN fires f ON f.new_id = i.id
    GROUP BY f.name
), adv AS (
    UPDATE slotd_schedules s
    SET last_fire_at = d.new_last,
        fired_at = now(),
        last_task_id = coalesce(e.last_id, s.last_task_id)
    FROM cur c
    JOIN due d ON d.name = c.name
    LEFT JOIN enqueued e ON e.name = c.name
    WHERE s.name = c.name AND c.ours
    RETURNING s.name
), wake AS (
    SELECT count(*) AS sent FROM (
        SELECT pg_notify('slotd_wake', '') FROM (SELECT 1 FROM ins LIMIT 1) one
    ) sent
)
SELECT c.name, c.ours, c.declared,
       CASE WHEN c.ours THEN d.new_last ELSE c.last_fire_at END AS last_fire_at,
       coalesce(e.ids, '{}') AS task_ids,
       now() + make_interval(secs => %(offset_s)s) AS db_now, c.expression
FROM cur c
JOIN due d ON d.name = c.name
LEFT JOIN enqueued e ON e.name = c.name
CROSS JOIN wake
ORDER BY c.name

-- name: schedules_gone
DELETE FROM slotd_schedule_declarations WHERE replica_id = %(replica_id)s

-- name: schedules_overview
-- `slotd schedules`: every row, with the live replicas that declare it (none: orphaned).
SELECT s.name, s.task_type, s.expression, s.timezone, s.catch_up, s.anchor_at,
       s.last_fire_at, s.fired_at,
       coalesce(jsonb_agg(jsonb_build_object('replica_id', r.replica_id,
                                             'hostname', r.hostname, 'pid', r.pid)
                          ORDER BY r.hostname, r.pid)
                FILTER (WHERE r.replica_id IS NOT NULL), '[]'::jsonb) AS declared_by,
       now() AS db_now
FROM slotd_schedules s
LEFT JOIN slotd_schedule_declarations r
       ON s.name = ANY(r.schedules) AND r.seen_at >= now() - interval '1 minute'
GROUP BY s.name
ORDER BY s.name

-- name: schedules_prune
-- `slotd schedules --prune`: rows no live replica declares. A schedule declared again
-- later starts afresh from its new row (no catch-up for the time it had no row).
WITH live AS (
    SELECT DISTINCT unnest(r.schedules) AS name FROM slotd_schedule_declarations r
    WHERE r.seen_at >= now() - interval '1 minute'
), stale AS (
    DELETE FROM slotd_schedule_declarations WHERE seen_at < now() - interval '1 minute'
)
DELETE FROM slotd_schedules s
WHERE NOT EXISTS (SELECT 1 FROM live WHERE live.name = s.name)
RETURNING s.name

-- name: runtime_schedule_clock
-- The database's clock for a put's first fire time: clock_timestamp(), not the caller's
-- transaction start, so a put in a long transaction does not begin in the past.
SELECT clock_timestamp()

-- name: runtime_schedule_put
-- slotd.put_schedule, in the caller's transaction: create or replace a runtime schedule.
-- A changed expression or zone starts it afresh from %(next_at)s (as a new schedule: no
-- catch-up of the old one's times); a payload or type change takes effect at its next fire.
-- No row comes back when a schedule declared in code holds the name (sql/042).
-- The control notification (delivered if the caller commits) tells every replica's schedule
-- thread to look now; otherwise it looks only at the soonest next fire time, or every 5
-- minutes (slotd/supervisor/runtime_schedules.py). An earlier release ignores the op.
WITH put AS (
INSERT INTO slotd_runtime_schedules AS r (name, task_type, expression, timezone, payload,
                                          next_fire_at)
SELECT %(name)s, %(task_type)s, %(expression)s, %(timezone)s, %(payload)s::jsonb,
       %(next_at)s
WHERE NOT EXISTS (SELECT 1 FROM slotd_schedules s WHERE s.name = %(name)s)
ON CONFLICT (name) DO UPDATE
SET task_type = excluded.task_type, payload = excluded.payload, updated_at = now(),
    expression = excluded.expression, timezone = excluded.timezone,
    next_fire_at = CASE WHEN (r.expression, r.timezone)
                             IS DISTINCT FROM (excluded.expression, excluded.timezone)
                        THEN excluded.next_fire_at ELSE r.next_fire_at END
RETURNING r.name, (xmax = 0) AS created
)
SELECT p.created
FROM put p
CROSS JOIN LATERAL (
    SELECT pg_notify('slotd_control', json_build_object(
        'op', 'schedule', 'name', p.name, 'by', '')::text)
) n

-- name: runtime_schedule_delete
DELETE FROM slotd_runtime_schedules WHERE name = %(name)s

-- name: runtime_schedules_list
SELECT r.name, r.task_type, r.expression, r.timezone, r.payload, r.next_fire_at,
       r.last_fire_at, now() AS db_now
FROM slotd_runtime_schedules r ORDER BY r.name

-- name: runtime_schedules_due
-- The runtime schedules whose next fire time has come, soonest first, locked until the
-- firing transaction ends; a row another replica is firing is skipped, not waited for.
SELECT r.name, r.task_type, r.expression, r.timezone, r.next_fire_at, now() AS db_now
FROM slotd_runtime_schedules r
WHERE r.next_fire_at <= now()
ORDER BY r.next_fire_at
LIMIT %(batch)s
FOR UPDATE SKIP LOCKED

-- name: runtime_schedules_fire
-- In the transaction of runtime_schedules_due, whose locks it holds: each schedule's task
-- for its latest due fire time (catch-up "latest": missed times fold into it), unless its
-- previous task is still live (overlap "skip"), and the row advanced to its next fire time,
-- compare-and-set on the time read. The task's key names the schedule and the instant, as a
-- declared schedule's task does, with a "runtime:" mark: the two kinds never share a key.
WITH due AS (
    SELECT * FROM unnest(%(names)s::text[], %(expected)s::timestamptz[],
                         %(fire_at)s::timestamptz[], %(next_at)s::timestamptz[])
        AS d(name, expected, fire_at, next_at)
), cur AS MATERIALIZED (
    SELECT r.name, r.task_type, r.payload, r.last_task_id, d.fire_at, d.next_at,
           nextval(pg_get_serial_sequence('slotd_tasks', 'id')) AS new_id,
           NOT EXISTS (SELECT 1 FROM slotd_tasks t WHERE t.id = r.last_task_id AND {live})
               AS free
    FROM slotd_runtime_schedules r
    JOIN due d ON d.name = r.name AND r.next_fire_at = d.expected
), ins AS (
    INSERT INTO slotd_tasks (id, task_type, payload, key, run_at, max_attempts, order_at)
    SELECT c.new_id, c.task_type, c.payload,
           'schedule:runtime:' || c.name || ':'
               || to_char(c.fire_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
           c.fire_at, %(max_attempts)s, c.fire_at
    FROM cur c WHERE c.free
    ORDER BY c.name
    ON CONFLICT (task_type, key) WHERE key IS NOT NULL AND attempt_count < max_attempts
    DO NOTHING
    RETURNING id
), adv AS (
    UPDATE slotd_runtime_schedules r
    SET next_fire_at = c.next_at, last_fire_at = c.fire_at,
        last_task_id = CASE WHEN i.id IS NOT NULL THEN i.id ELSE r.last_task_id END
    FROM cur c LEFT JOIN ins i ON i.id = c.new_id
    WHERE r.name = c.name
    RETURNING r.name, i.id AS task_id
), wake AS (
    SELECT count(*) AS sent FROM (
        SELECT pg_notify('slotd_wake', '') FROM (SELECT 1 FROM ins LIMIT 1) one
    ) sent
)
SELECT a.name, a.task_id FROM adv a CROSS JOIN wake ORDER BY a.name

-- name: runtime_schedules_next
-- When the thread must look again: the soonest next fire time, and the database's clock.
SELECT (SELECT min(r.next_fire_at) FROM slotd_runtime_schedules r) AS next_at, now() AS db_now
