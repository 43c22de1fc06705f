-- Every statement slotd runs against the queue, by name. slotd/repository.py loads this
-- file and is the only module that executes SQL. Predicates are written once, here, and
-- spliced into the statements as {name}; every statement aliases slotd_tasks as t.

-- predicate: lease_live
(t.lease_expires_at IS NOT NULL AND t.lease_expires_at > now())

-- predicate: claimable
-- An operator's cancel raises attempt_count to max_attempts, so the attempts clause is also
-- what keeps a cancelled task from ever being claimed again (see `cancel`).
(t.run_at <= now() AND t.attempt_count < t.max_attempts
 AND (t.lease_expires_at IS NULL OR t.lease_expires_at <= now())
 AND {unpaused} AND {unexpired})

-- predicate: unexpired
-- Not past its expires_in (sql/023): from that instant no attempt starts, whether or not the
-- expiry sweep has made it a dead letter yet.
(t.expires_at IS NULL OR t.expires_at > now())

-- predicate: unpaused
-- Not of a paused type. NOT IN over an uncorrelated sub-select is a hashed SubPlan: the
-- table is read once per statement and each row then costs one hash probe, so with nothing
-- paused a discovery or a claim pays one look at an empty table. The form matters: with
-- `<> ALL (ARRAY(...))` the planner guessed one matching row and sorted every due row
-- instead of walking the due index to its LIMIT (550 ms a discovery at a million due rows,
-- tests/bench/control_cost.py). Every reader of {claimable} inherits it, so the oldest-due
-- gauge (and with it the starvation alert) ignores paused work too.
(t.task_type NOT IN (SELECT p.task_type FROM slotd_paused_types p WHERE {pause_active}))

-- predicate: tagged
-- Carries the tag %(tag)s (sql/040), or no tag was asked for. Containment, which the GIN
-- index slotd_tasks_tags answers; only tagged rows are in it. slotd.tasks(tag=) and the
-- dashboard's search both splice it.
(%(tag)s::text IS NULL OR (t.tags IS NOT NULL AND t.tags @> ARRAY[%(tag)s::text]))

-- predicate: pause_active
(p.until IS NULL OR p.until > now())

-- predicate: dead
(t.attempt_count >= t.max_attempts
 AND (t.lease_expires_at IS NULL OR t.lease_expires_at <= now()))

-- fragment: task_state
-- A task's state (docs/ARCHITECTURE.md, "A task's states"; slotd/repository/states.py):
-- the database's own definition (sql/090_task_state.sql, where the states are listed), the
-- one every reader of states uses (slotd.result, slotd status, slotd.tasks(state=), the
-- dashboard, Django's results). Inlined by the planner: a statement calling it plans as if
-- its CASE were written here. Splice it where slotd_tasks is aliased t.
slotd_task_state(t)

-- predicate: ended
-- A dead letter whose end has been written: no lease left on it. A final attempt whose lease
-- lapsed is dead by {dead} from that instant but not ended until the lapse statement (or
-- an operator's action, which runs it first) writes its end: its batch count, its
-- dependants' cancel. Operator actions on dead letters act on ended ones only.
(t.lease_token IS NULL)

-- predicate: live
-- A cancelled task still under its lease is being stopped, not live work: a fresh enqueue
-- of its key makes a new task rather than returning the one about to become a dead letter.
-- Nor is a task past its expires_at that no lease holds: it will never start ({claimable}
-- refuses it), whether or not the expiry sweep has ended it yet, so an enqueue of its key
-- must not fold into it (it ends it instead: `expire_key`), a cancel leaves it to its expiry
-- and no dependant waits on it.
((t.attempt_count < t.max_attempts AND ({unexpired} OR {lease_live}))
 OR ({lease_live} AND t.cancelled_at IS NULL))

-- fragment: task_key
-- A task's key as its handler and operators see it: a unique="pending" row keeps it in
-- started_key once claimed (sql/016), out of the dedupe index.
coalesce(t.key, t.started_key)

-- fragment: shown_run_at
-- run_at as the readers that show a row get it: NULL for a dependant waiting on its parents
-- (run_at = 'infinity', sql/019), which a Python datetime cannot hold.
CASE WHEN isfinite(t.run_at) THEN t.run_at END AS run_at

-- fragment: retired_at
-- When a dead letter stopped: its cancel, else its last attempt (a task cancelled before it
-- ever ran has no attempt; one that expired before it ever ran carries its expiry there,
-- see `expire`). Retention and the listing measure from here, through the expression
-- indexes of sql/010: keep it this expression.
coalesce(t.cancelled_at, t.last_attempted_at)

-- fragment: attempts_made
-- The attempts a task really ran. A dead letter's count as it stopped (sql/021): every
-- terminal state but exhaustion raises attempt_count to the threshold for this release (0.1.0
-- replicas tell dead from live by that comparison), so readers show dead_attempts instead.
CASE WHEN t.attempt_count >= t.max_attempts THEN coalesce(t.dead_attempts, t.attempt_count)
     ELSE t.attempt_count END

-- fragment: dead_reason
-- Why a dead letter stopped: exhausted, cancelled, expired, parent_failed (sql/021). A row
-- made dead by a 0.1.0 replica, or by a lease that lapsed on its final attempt with nobody
-- left to settle it, carries none: its cancel stamp tells the two apart.
CASE WHEN t.attempt_count >= t.max_attempts
     THEN coalesce(t.dead_reason, CASE WHEN t.cancelled_at IS NOT NULL THEN 'cancelled'
                                       ELSE 'exhausted' END) END

-- fragment: exhausted_reason
-- What an attempt's settlement writes as dead_reason (the attempt count is the claim's, not
-- changed by the settlement): live rows carry none, a cancelled attempt keeps its cancel's,
-- and an attempt that was the last makes the row 'exhausted'.
CASE WHEN t.attempt_count < t.max_attempts THEN NULL
     WHEN t.cancelled_at IS NOT NULL THEN 'cancelled' ELSE 'exhausted' END

-- fragment: exhausted_attempts
CASE WHEN t.attempt_count < t.max_attempts THEN NULL
     WHEN t.cancelled_at IS NOT NULL THEN t.dead_attempts ELSE t.attempt_count END

-- predicate: retryable
-- Pending work: below the attempt threshold (due or not, leased or not). The gauges, the
-- status command and the dashboard count it by this one definition.
(t.attempt_count < t.max_attempts)

-- predicate: final_running
-- On its final attempt under a live lease: still pending until it settles.
(t.lease_token IS NOT NULL AND t.attempt_count >= t.max_attempts AND {lease_live})

-- predicate: running
(t.lease_token IS NOT NULL AND {lease_live})
-- predicate: in_order_window
-- The index condition of every scan in delivery order: no due row has an ordering key
-- later than now() plus the largest head start (100 x the step), so the scan stops there
-- instead of walking every future row. lead_s = 100 x this process's SLOTD_PRIORITY_STEP.
(t.order_at <= now() + make_interval(secs => %(lead_s)s))

-- predicate: head_start
-- How much earlier than run_at a row is ordered (priority x step, stamped at enqueue).
-- Every statement that moves run_at keeps it: order_at = <new run_at> - {head_start}.
(t.run_at - t.order_at)

-- predicate: within_limits
-- The concurrency limits of the row's type, against live leases in the table (a crashed
-- worker's lease counts until it is settled or lapses). limited / max_running /
-- max_per_group are parallel arrays from the registry; an unlimited type is one
-- array_position miss and nothing else. settling / settling_token: the row the same
-- statement is dequeuing, whose place is free. Race-safe only under the claim_lock taken
-- by an earlier statement of the claim's transaction (see Repository.claim).
(CASE WHEN array_position(%(limited)s::text[], t.task_type) IS NULL THEN true
 ELSE (CASE WHEN (%(max_running)s::int[])[array_position(%(limited)s::text[], t.task_type)]
                 IS NULL THEN true
            ELSE (SELECT count(*) FROM slotd_tasks l
                  WHERE l.task_type = t.task_type AND l.lease_token IS NOT NULL
                    AND l.lease_expires_at > now()
                    AND NOT coalesce(l.id = %(settling)s::bigint
                                     AND l.lease_token = %(settling_token)s::uuid, false))
                 < (%(max_running)s::int[])[array_position(%(limited)s::text[], t.task_type)]
       END)
  AND (CASE WHEN t.task_group IS NULL
                 OR (%(max_per_group)s::int[])[array_position(%(limited)s::text[], t.task_type)]
                    IS NULL THEN true
            ELSE {group_leases}
                 < (%(max_per_group)s::int[])[array_position(%(limited)s::text[], t.task_type)]
                 -- A group's burst above its cap (group_burst): see group_burst_closed.
                 OR NOT {group_burst_closed}
       END)
 END)
 AND {within_shared}

-- fragment: group_leases
-- How many live leases the row's group of its type holds (within_limits, group_burst_closed):
-- read through slotd_tasks_leased_group, a handful of rows. The row this statement is
-- settling (settling / settling_token) has left its place.
(SELECT count(*) FROM slotd_tasks l
 WHERE l.task_type = t.task_type AND l.task_group = t.task_group
   AND l.lease_token IS NOT NULL AND l.lease_expires_at > now()
   AND NOT coalesce(l.id = %(settling)s::bigint
                    AND l.lease_token = %(settling_token)s::uuid, false))

-- predicate: group_burst_closed
-- Whether the row's group, at its max_running_per_group, may NOT start one more now: its
-- burst (group_burst, #39) lets it run that many above the cap while no other group of the
-- type has a due task nobody holds. Two probes of slotd_tasks_fair, below and above this
-- group's name, in the index's order with a LIMIT (an EXISTS the planner may answer with a
-- sequential scan betting on an early match), so the group's own backlog is never walked.
-- A registry without a burst never names it: spliced as `true` (closed) into the plain
-- statements, and carried only by their `_shared` twins (slotd/repository/named.py,
-- SHARED_PARTS), which the repository runs for a registry with a burst or a shared limit.
-- Its two probes and a second lease count cost the plan of every claim that names them
-- (plain no-op tasks: PostgreSQL 210 -> 231 µs/task when every claim carried them).
(NOT ((%(group_burst)s::int[])[array_position(%(limited)s::text[], t.task_type)] > 0
      AND {group_leases}
          < (%(max_per_group)s::int[])[array_position(%(limited)s::text[], t.task_type)]
            + (%(group_burst)s::int[])[array_position(%(limited)s::text[], t.task_type)]
      AND (SELECT o.task_group FROM slotd_tasks o
           WHERE o.task_type = t.task_type AND o.task_group < t.task_group
             AND o.attempt_count < o.max_attempts AND o.run_at <= now()
             AND (o.lease_expires_at IS NULL OR o.lease_expires_at <= now())
           ORDER BY o.task_type, o.task_group DESC LIMIT 1) IS NULL
      AND (SELECT o.task_group FROM slotd_tasks o
           WHERE o.task_type = t.task_type AND o.task_group > t.task_group
             AND o.attempt_count < o.max_attempts AND o.run_at <= now()
             AND (o.lease_expires_at IS NULL OR o.lease_expires_at <= now())
           ORDER BY o.task_type, o.task_group LIMIT 1) IS NULL))

-- predicate: type_open
-- Served types a claim may start now (s.task_type, one row per served type): not paused,
-- not at their max_running, their rate window not full (sql/022). Decided once per type,
-- before its rows are read: a closed type's backlog costs the discovery nothing per row (a
-- filter on each row still walked every row of a full type to the end of its due range,
-- since none could pass). Each list is an uncorrelated sub-select, a hashed SubPlan read
-- once per statement.
(s.task_type NOT IN (SELECT p.task_type FROM slotd_paused_types p WHERE {pause_active})
 AND s.task_type NOT IN (
    SELECT lt.task_type
    FROM unnest(%(limited)s::text[], %(max_running)s::int[]) AS lt(task_type, max_running)
    WHERE lt.max_running IS NOT NULL
      AND (SELECT count(*) FROM slotd_tasks l
           WHERE l.task_type = lt.task_type AND l.lease_token IS NOT NULL
             AND l.lease_expires_at > now()) >= lt.max_running)
 AND s.task_type NOT IN (
    SELECT w.task_type FROM slotd_rate_windows w
    WHERE w.free_at > now() AND NOT w.per_group
      AND (%(rate_n)s::int[])[array_position(%(rated)s::text[], w.task_type)] IS NOT NULL)
 AND {shared_open})

-- predicate: group_rate_open
-- The row's group has room in its rate window, as discovery sees it (the claim decides,
-- exactly: within_rates). One hash probe per row of a grouped, rated type.
(t.task_group IS NULL OR (t.task_type, t.task_group) NOT IN (
    SELECT w.task_type, w.task_group FROM slotd_rate_windows w
    WHERE w.free_at > now() AND w.per_group
      AND (%(group_rate_n)s::int[])[array_position(%(rated)s::text[], w.task_type)]
          IS NOT NULL))

-- predicate: within_rates
-- Rates (sql/022): the start N places back in the type's window (and in its group's) is at
-- least the window's length old, or there is none: then this start keeps every window of
-- that length at N starts or fewer. Exact, by the database's clock read after the limit
-- lock (clock_timestamp(): now() is the transaction's start, before the lock wait, and
-- would let a claim that waited stamp its start before the one it waited for). rated /
-- rate_n / rate_s / group_rate_n / group_rate_s are parallel arrays from the registry; an
-- unrated type is one array_position miss. Race-safe only under claim_lock, like
-- within_limits. Then the shared limits' rates (within_shared_rates).
((array_position(%(rated)s::text[], t.task_type) IS NULL
 OR (NOT EXISTS (
        SELECT 1 FROM slotd_rate_windows w
        JOIN slotd_rate_starts rs
          ON rs.task_type = w.task_type AND rs.per_group = w.per_group
         AND rs.task_group = w.task_group
         AND rs.seq = w.last_seq + 1
                      - (%(rate_n)s::int[])[array_position(%(rated)s::text[], t.task_type)]
        WHERE w.task_type = t.task_type AND NOT w.per_group AND w.task_group = ''
          AND rs.started_at > clock_timestamp() - make_interval(secs =>
                (%(rate_s)s::float8[])[array_position(%(rated)s::text[], t.task_type)]))
     AND (t.task_group IS NULL OR NOT EXISTS (
        SELECT 1 FROM slotd_rate_windows w
        JOIN slotd_rate_starts rs
          ON rs.task_type = w.task_type AND rs.per_group = w.per_group
         AND rs.task_group = w.task_group
         AND rs.seq = w.last_seq + 1
                      - (%(group_rate_n)s::int[])[array_position(%(rated)s::text[], t.task_type)]
        WHERE w.task_type = t.task_type AND w.per_group AND w.task_group = t.task_group
          AND rs.started_at > clock_timestamp() - make_interval(secs =>
                (%(group_rate_s)s::float8[])[array_position(%(rated)s::text[], t.task_type)])
     ))))
 AND {within_shared_rates})

-- name: bound
-- SET LOCAL semantics, so the bound holds behind a transaction-mode pooler too. jit: see
-- read_committed_session.
SELECT set_config('statement_timeout', %(statement_timeout)s, true),
       set_config('lock_timeout', %(lock_timeout)s, true),
       set_config('jit', 'off', true)

-- name: bound_async
-- SLOTD_SYNCHRONOUS_COMMIT=off: the same bound, and this write's commit does not wait for
-- its WAL flush. A server crash can then forget the last moments of claims and
-- settlements: a forgotten claim leaves its row claimable again, a forgotten settlement
-- runs its task again. At-least-once delivery already allows both; enqueues are untouched.
SELECT set_config('statement_timeout', %(statement_timeout)s, true),
       set_config('lock_timeout', %(lock_timeout)s, true),
       set_config('jit', 'off', true),
       set_config('synchronous_commit', 'off', true)

-- name: bind_session
-- The same bounds for a whole session: a slot's own direct connection (Repository.bind_session),
-- never one behind a transaction-mode pooler, where a session setting outlives the transaction
-- on whichever server connection ran it. With them the session's isolation: see
-- read_committed_session.
SELECT set_config('statement_timeout', %(statement_timeout)s, false),
       set_config('lock_timeout', %(lock_timeout)s, false),
       set_config('jit', 'off', false),
       set_config('default_transaction_isolation', 'read committed', false)

-- name: bind_session_async
-- bind_session with SLOTD_SYNCHRONOUS_COMMIT=off: see bound_async.
SELECT set_config('statement_timeout', %(statement_timeout)s, false),
       set_config('lock_timeout', %(lock_timeout)s, false),
       set_config('jit', 'off', false),
       set_config('default_transaction_isolation', 'read committed', false),
       set_config('synchronous_commit', 'off', false)

-- name: read_committed_session
-- Every queue write runs at READ COMMITTED, whatever the database's, the role's or the
-- pooler's default_transaction_isolation: a limited claim's statement must take a fresh
-- snapshot after its lock (see claim_lock), and FOR UPDATE / SKIP LOCKED re-check a row
-- another transaction changed instead of failing with a serialization error. Under
-- REPEATABLE READ the snapshot is taken at the transaction's first statement, before the
-- lock, and two slots woken together both see the last place free. On a direct connection
-- this is set once for the session (db.connect, Repository.bind_session): no statement
-- per write.
-- And no JIT: slotd's statements are short index walks, and PostgreSQL compiles a plan
-- whose estimated cost passes jit_above_cost (100,000 by default). A queue table behind a
-- held xmin, or bloated after one, has estimates that do: every discovery then spent 3.1 s
-- of its 3.2 s compiling (tests/bench/soak.py with --hold-at, EXPLAIN ANALYZE of
-- `discover`), and the replica drained at half its rate long after the transaction ended.
-- Behind a transaction-mode pooler a write carries it in its own bound (`bound`); a
-- discovery there does not: set jit = off for slotd's role (README, PgBouncer).
SELECT set_config('default_transaction_isolation', 'read committed', false),
       set_config('jit', 'off', false)

-- name: generic_plans_session
-- A slot's own direct sessions plan their prepared statements once, generically, instead
-- of re-planning for each call's parameters (PostgreSQL's default tries five custom plans
-- and keeps them while they look cheaper). slotd's statements are index walks whose best
-- plan does not depend on the values, and planning is what grows with the table's dead
-- entries: behind a held xmin the planner's own index probes (get_actual_variable_range
-- reads the order index's ends, dead entries and all) made every custom-planned discovery
-- cost more than running it, and a replica drained at 70% of the rate during the hold and
-- never recovered after it (tests/bench/soak.py --hold-at, RESULTS.md). Set only where the
-- session is ours (slotd/slot/connections.py): behind a transaction-mode pooler a session
-- setting would land on whichever server connection ran it. JIT is off on these sessions
-- (bind_session, read_committed_session): a generic plan's estimates would pass
-- jit_above_cost at volume, and compiling costs more than the walk.
SELECT set_config('plan_cache_mode', 'force_generic_plan', false)

-- name: read_committed_local
-- The same for one write behind a transaction-mode pooler, where a session setting would
-- land on some other client's server connection: the first statement of the write's
-- pipeline, before anything takes a snapshot (a SET takes none; a SELECT would, and the
-- isolation level can no longer change after it).
SET LOCAL transaction_isolation TO 'read committed'

-- name: enqueue
-- One statement: dedupe against live rows, insert, and fire the wake. pg_notify inside
-- the caller's transaction is delivered only if it commits, and identical notifications
-- collapse, so a thousand rows cost one wake.
-- trace: the producer's trace context (sql/009), one for the whole call (every row of it
-- was enqueued under the same span), NULL when no span was active.
-- run_ats: an absolute due time (enqueue's run_at=) where given, else now() + the delay;
-- tags: each row's JSON array of tags (sql/040), NULL for none.
WITH input AS (
    SELECT i.ord, i.task_type, i.payload, i.key, i.priority, i.task_group, i.lead_s,
           coalesce(i.pending, false) AS pending, i.expires_s,
           coalesce(i.run_at, now() + make_interval(secs => i.delay_s)) AS due_at,
           CASE WHEN i.tags IS NOT NULL
                THEN ARRAY(SELECT jsonb_array_elements_text(i.tags)) END AS tags,
           nextval(pg_get_serial_sequence('slotd_tasks', 'id')) AS new_id
    FROM unnest(%(types)s::text[], %(payloads)s::jsonb[], %(keys)s::text[],
                %(delays)s::float8[], %(priorities)s::smallint[], %(groups)s::text[],
                %(leads)s::float8[], %(pending)s::boolean[], %(expires)s::float8[],
                %(run_ats)s::timestamptz[], %(tags)s::jsonb[])
         WITH ORDINALITY AS i(task_type, payload, key, delay_s, priority, task_group, lead_s,
                              pending, expires_s, run_at, tags, ord)
), existing_live AS (
    -- unique="live": any live row with the key. One index look-up per keyed input row;
    -- unkeyed rows never touch the table here.
    SELECT i.ord, found.id
    FROM input i
    CROSS JOIN LATERAL (
        SELECT t.id FROM slotd_tasks t
        WHERE t.task_type = i.task_type AND t.key = i.key AND {live}
        ORDER BY t.id LIMIT 1
    ) found
    WHERE i.key IS NOT NULL AND NOT i.pending
), existing_pending AS (
    -- unique="pending": a row holding the key that has not started (sql/016), locked until
    -- the caller's transaction ends, so no claim (FOR UPDATE SKIP LOCKED) starts it before
    -- the caller's writes are visible. A row being claimed meanwhile is waited for and then
    -- no longer matches (its key moved): the insert below goes ahead.
    SELECT i.ord, found.id
    FROM input i
    CROSS JOIN LATERAL (
        SELECT t.id FROM slotd_tasks t
        WHERE t.task_type = i.task_type AND t.key = i.key AND t.lease_token IS NULL
          AND t.attempt_count < t.max_attempts AND {unexpired}
        ORDER BY t.id LIMIT 1
        FOR SHARE OF t
    ) found
    WHERE i.key IS NOT NULL AND i.pending
), existing AS (
    SELECT * FROM existing_live UNION ALL SELECT * FROM existing_pending
), ins AS (
    INSERT INTO slotd_tasks (id, task_type, payload, key, run_at, max_attempts,
                             max_attempts_explicit, priority, task_group, order_at,
                             unique_pending, trace_context, expires_at, tags)
    SELECT i.new_id, i.task_type, i.payload, i.key,
           i.due_at, %(max_attempts)s, %(explicit)s,
           i.priority, i.task_group, i.due_at - make_interval(secs => i.lead_s),
           i.pending AND i.key IS NOT NULL, %(trace)s::jsonb,
           now() + make_interval(secs => i.expires_s), i.tags
    FROM input i
    WHERE NOT EXISTS (SELECT 1 FROM existing e WHERE e.ord = i.ord)
    ORDER BY i.ord
    ON CONFLICT (task_type, key) WHERE key IS NOT NULL AND attempt_count < max_attempts
    DO NOTHING
    RETURNING id, run_at
), wake AS (
    -- A delayed row wakes a slot too: its discovery finds nothing due yet but says when it
    -- will be (see `discover`), and the supervisor sets its timer for then, instead of the
    -- row waiting for the next poll tick. A dependant (run_at 'infinity') is woken by its
    -- last parent's settlement, not here.
    SELECT count(*) AS sent FROM (
        SELECT pg_notify('slotd_wake', '')
        FROM (SELECT 1 FROM ins WHERE ins.run_at < 'infinity' LIMIT 1) due
    ) sent
)
SELECT i.ord, coalesce(e.id, n.id) AS id, i.task_type, i.key, n.id IS NOT NULL AS created
FROM input i
LEFT JOIN existing e ON e.ord = i.ord
LEFT JOIN ins n ON n.id = i.new_id
CROSS JOIN wake
ORDER BY i.ord

-- name: live_by_key
-- Second look for keys whose insert met a concurrent enqueue (ON CONFLICT DO NOTHING):
-- a new statement sees the row the other transaction committed.
SELECT t.id FROM slotd_tasks t
WHERE t.task_type = %(task_type)s AND t.key = %(key)s AND {live}
ORDER BY t.id LIMIT 1

-- name: pending_by_key
-- The same second look for unique="pending": the row holding the key, if it has not
-- started, locked as in enqueue's existing_pending. None: the key is held by a running
-- unique="live" row (it dedupes; see live_by_key) or by nothing any more (insert again).
SELECT t.id FROM slotd_tasks t
WHERE t.task_type = %(task_type)s AND t.key = %(key)s AND t.lease_token IS NULL
  AND t.attempt_count < t.max_attempts AND {unexpired}
ORDER BY t.id LIMIT 1
FOR SHARE OF t

-- name: discover
-- In ordering-key order. Rows their own type's or group's limit holds back are passed over
-- here (a read, no attempt burnt), so a head of blocked rows never hides the work behind it.
-- Index-driven per served type (slotd_tasks_order_by_type, sql/011): each open type's first
-- claimable rows by one range scan, then merged by the ordering key, so rows of types this
-- replica does not serve, and of types closed right now (type_open), are never read.
-- The key (order_at, id) appears inside and outside the LATERAL. DISTINCT: a type listed
-- twice still yields its rows once. tests/test_repository.py pins the plan.
-- After the candidates, rows with id NULL say when to look again (the slot's next wake when
-- it found nothing, slotd.supervisor.wake): per served type whose rate window (or one of
-- its groups') is full, in how many seconds it has room again (a rate's end is announced by
-- no notification); per served type, in how many seconds its next row not yet due (a delay,
-- a backoff) is due, one step down slotd_tasks_due_by_type (no notification announces a
-- row becoming due either: without this an idle fleet started it at its next poll tick);
-- and, with task_type NULL, in how many seconds the soonest task no lease holds reaches its
-- expires_at (negative: past it already), for the supervisor's expiry sweep (any type: the
-- sweep is the fleet's). Their own aliases (n, x): `t` is the candidates' scan.
(SELECT d.id, d.task_type, NULL::float8 AS wait_s
 FROM (SELECT DISTINCT s.task_type FROM unnest(%(types)s::text[]) AS s(task_type)
       WHERE {type_open}) served
 CROSS JOIN LATERAL (
     SELECT t.id, t.task_type, t.order_at FROM slotd_tasks t
     WHERE t.task_type = served.task_type AND {claimable} AND {in_order_window}
       AND {within_limits} AND {group_rate_open}
     ORDER BY t.order_at, t.id
     LIMIT %(limit)s
 ) d
 ORDER BY d.order_at, d.id
 LIMIT %(limit)s)
UNION ALL
{discover_waits}

-- fragment: discover_waits
-- discover's rows with id NULL (see discover), shared with discover_fair.
SELECT NULL, w.task_type, extract(epoch FROM min(w.free_at) - now())::float8
FROM slotd_rate_windows w
WHERE w.free_at > now() AND w.task_type = ANY(%(rated)s::text[])
  AND w.task_type = ANY(%(types)s::text[])
GROUP BY w.task_type
{shared_rate_waits}
UNION ALL
SELECT NULL, served.task_type, extract(epoch FROM nd.run_at - now())::float8
FROM (SELECT DISTINCT s.task_type FROM unnest(%(types)s::text[]) AS s(task_type)) served
CROSS JOIN LATERAL (
    SELECT n.run_at FROM slotd_tasks n
    WHERE n.task_type = served.task_type AND n.attempt_count < n.max_attempts
      AND n.run_at > now() AND n.run_at < 'infinity'
    ORDER BY n.run_at
    LIMIT 1
) nd
UNION ALL
(SELECT NULL, NULL, extract(epoch FROM x.expires_at - now())::float8
 FROM slotd_tasks x
 WHERE x.expires_at IS NOT NULL AND x.attempt_count < x.max_attempts
   AND NOT (x.lease_expires_at IS NOT NULL AND x.lease_expires_at > now())
 ORDER BY x.expires_at
 LIMIT 1)

-- fragment: claim_ctes
-- MATERIALIZED, not a FROM-subquery: a subquery may be rescanned once per outer tuple of a
-- nested loop and each rescan would lease another row. One statement, one row.
-- One candidate at a time, each looked up by its primary key alone (the lateral subquery is
-- parameterised on the id): left to choose a plan for all candidates at once, with statistics
-- from an empty table (a bulk enqueue before autoanalyze) the planner guessed a handful of due
-- rows and read every due row through a due index on each claim: 40-155 ms a claim at 20,000
-- rows (tests/test_repository.py pins the plan). The lock stays beside the predicates on t,
-- so a row leased meanwhile is rechecked (EvalPlanQual) and skipped. No ORDER BY: a sort
-- would lock every claimable candidate before the LIMIT; the nested loop over the unnested
-- array stops at its first claimable row, in the caller's order (the discovery's: ordering
-- key, then id), so slots that discovered the same rows each take the first one nobody else
-- holds: SKIP LOCKED passes a row another claim is taking, the recheck one it has taken.
-- A claim that may pick a rated type is claim_ctes_rated: the rate tables are in no
-- other claim's plan (each table and index a statement names is locked and opened on
-- every execution, whether or not a row of it is read).
{claim_picked}, {claim_lease}

-- fragment: claim_ctes_rated
-- claim_ctes for candidates that may be of a rated type (sql/022): the same pick with
-- within_rates, the same lease, and the start recorded in the rate's windows.
{claim_picked_rated}, {claim_lease}, {claim_rate_record}

-- fragment: claim_picked
picked AS MATERIALIZED (
    SELECT l.id, l.lapsed_at, l.lapsed_started FROM unnest(%(ids)s::bigint[]) AS c(id)
    CROSS JOIN LATERAL (
        SELECT t.id, {lapsed_lease} FROM slotd_tasks t
        WHERE t.id = c.id AND {claimable}
          AND t.task_type = ANY(%(types)s::text[]) AND {within_limits}
        LIMIT 1
        FOR UPDATE OF t SKIP LOCKED
    ) l
    LIMIT 1
)

-- fragment: claim_picked_rated
-- claim_picked, plus within_rates, and the type and group the rate CTEs record.
picked AS MATERIALIZED (
    SELECT l.id, l.task_type, l.task_group, l.lapsed_at, l.lapsed_started
    FROM unnest(%(ids)s::bigint[]) AS c(id)
    CROSS JOIN LATERAL (
        SELECT t.id, t.task_type, t.task_group, {lapsed_lease} FROM slotd_tasks t
        WHERE t.id = c.id AND {claimable}
          AND t.task_type = ANY(%(types)s::text[]) AND {within_limits} AND {within_rates}
        LIMIT 1
        FOR UPDATE OF t SKIP LOCKED
    ) l
    LIMIT 1
)

-- fragment: claim_lease
claimed AS (
    UPDATE slotd_tasks t
    -- Random, from the server's strong source; a claim riding on a settlement brings its
    -- own (uuid4, from the client's), so that a connection lost before the answer came back
    -- can be resolved by asking who holds it (see `held_lease`).
    SET lease_token = coalesce(%(lease_token)s::uuid, gen_random_uuid()),
        lease_expires_at = now() + c.ceiling + make_interval(secs => %(margin_s)s),
        attempt_count = t.attempt_count + 1,
        last_attempted_at = now(),
        -- The claiming worker's threshold, unless the producer gave one: the dead
        -- predicate, the gauges, `dead list` and retention then agree with this worker.
        max_attempts = CASE WHEN t.max_attempts_explicit THEN t.max_attempts
                            ELSE c0.max_attempts END,
        -- unique="pending": a started row gives its key up to the next enqueue (sql/016).
        key = CASE WHEN t.unique_pending THEN NULL ELSE t.key END,
        started_key = CASE WHEN t.unique_pending THEN {task_key} ELSE t.started_key END
    FROM picked,
         unnest(%(types)s::text[], %(ceilings_s)s::float8[], %(max_attempts)s::int[])
             AS c0(task_type, ceiling_s, max_attempts),
         LATERAL (SELECT make_interval(secs => c0.ceiling_s) AS ceiling) c
    WHERE t.id = picked.id AND c0.task_type = t.task_type
    -- trace_context, has_dependants, parent_results, batch_id, steps last, in
    -- repository.Claimed's order. steps: the task's stored durable steps (sql/070), which
    -- the attempt replays instead of running them again; NULL for a task that took none.
    RETURNING t.id, t.task_type, t.payload, {task_key}, t.run_at, t.attempt_count,
              t.max_attempts, t.lease_token, t.lease_expires_at, now() AS claimed_at,
              t.trace_context, t.has_dependants, {parent_results}, t.batch_id, t.steps,
              picked.lapsed_at, picked.lapsed_started
)

-- fragment: lapsed_lease
-- The lease this claim takes over, if one lapsed on the row (a replica died whole, or was
-- frozen, with an attempt left to run): when it lapsed and when its attempt started, read
-- under the claim's row lock before the claim overwrites them. The claim's holder then
-- remembers that attempt (`lapse_remembered`, slotd/lifecycle/, "lapsed"); NULL for every
-- other claim. No table beyond the task's is named: the plain claim's plan is unchanged.
CASE WHEN t.lease_token IS NOT NULL THEN t.lease_expires_at END AS lapsed_at,
CASE WHEN t.lease_token IS NOT NULL THEN t.last_attempted_at END AS lapsed_started

-- fragment: claim_rate_record
rate_starts AS (
    -- A rated type's start counts in its windows (sql/022, within_rates): the type's own
    -- and its group's. Stamped here, in the statement that takes the lease, under the limit
    -- lock: a committed lease always has its start counted, and starts are stamped in the
    -- order they happen. Unrated types make no row here and write nothing below.
    SELECT p.task_type, b.per_group, b.task_group, b.allowed, b.window_s,
           clock_timestamp() AS at
    FROM picked p
    CROSS JOIN LATERAL (SELECT array_position(%(rated)s::text[], p.task_type) AS i) r
    CROSS JOIN LATERAL (VALUES
        (false, '', (%(rate_n)s::int[])[r.i], (%(rate_s)s::float8[])[r.i]),
        (true, p.task_group, (%(group_rate_n)s::int[])[r.i], (%(group_rate_s)s::float8[])[r.i])
    ) AS b(per_group, task_group, allowed, window_s)
    WHERE r.i IS NOT NULL AND b.allowed IS NOT NULL AND b.task_group IS NOT NULL
      AND EXISTS (SELECT 1 FROM claimed)
    {shared_rate_starts}
), rate_windows AS (
    -- The window moves on by one start; free_at: when the next start may come (the start
    -- N - 1 places back from this one, plus the window), for discovery and `slotd status`.
    INSERT INTO slotd_rate_windows AS w
        (task_type, per_group, task_group, last_seq, last_start_at, allowed, window_s, free_at)
    SELECT r.task_type, r.per_group, r.task_group, 1, r.at, r.allowed, r.window_s,
           r.at + CASE WHEN r.allowed = 1 THEN make_interval(secs => r.window_s)
                       ELSE interval '0' END
    FROM rate_starts r
    ON CONFLICT (task_type, per_group, task_group) DO UPDATE
    SET last_seq = w.last_seq + 1,
        last_start_at = excluded.last_start_at,
        allowed = excluded.allowed,
        window_s = excluded.window_s,
        free_at = CASE WHEN excluded.allowed = 1 THEN excluded.free_at
                  ELSE coalesce((SELECT rs.started_at FROM slotd_rate_starts rs
                                 WHERE rs.task_type = w.task_type
                                   AND rs.per_group = w.per_group
                                   AND rs.task_group = w.task_group
                                   AND rs.seq = w.last_seq + 2 - excluded.allowed)
                                + make_interval(secs => excluded.window_s),
                                excluded.last_start_at) END
    RETURNING w.task_type, w.per_group, w.task_group, w.last_seq, w.last_start_at, w.allowed
), rate_counted AS (
    INSERT INTO slotd_rate_starts (task_type, per_group, task_group, seq, started_at)
    SELECT m.task_type, m.per_group, m.task_group, m.last_seq, m.last_start_at
    FROM rate_windows m
), rate_dropped AS (
    -- The start that fell out of the last N: no claim looks it up again.
    DELETE FROM slotd_rate_starts rs
    USING rate_windows m
    WHERE rs.task_type = m.task_type AND rs.per_group = m.per_group
      AND rs.task_group = m.task_group AND rs.seq <= m.last_seq - m.allowed
)

-- name: claim_lock
-- Taken by its own statement before a claim that may pick a limited type, in the same
-- transaction: the claim then starts with a snapshot that already sees the leases of
-- whoever held the lock before (a lock waited for inside the claim statement would not
-- refresh its snapshot, and two slots racing for the last place could both win). Held
-- to commit; keys in sorted order, so two claims never wait on each other in a cycle.
-- Unlimited types never come here.
SELECT pg_advisory_xact_lock(hashtextextended('slotd.limit:' || k.task_type, 0))
FROM unnest(%(lock_types)s::text[]) WITH ORDINALITY AS k(task_type, ord)
ORDER BY k.ord

-- The claim and settle paths are composed, not enumerated (slotd/repository/composed.py):
-- a statement is the CTEs of one settlement part (what a task's end writes: `settled_*`,
-- `failed_*`, by the features the task uses) and of one claim part (`claim_ctes`,
-- `claim_ctes_rated`, or none), then the answer below (`*_answer`) and the FROM items
-- that make the part's notifications run (`*_told`). A plain task's statements compose
-- to the very texts they had as named statements: its hot path pays for no feature.

-- fragment: claimed_answer
-- A claim alone (no settlement riding on it): the leased row, or none.
SELECT * FROM claimed

-- fragment: settled_claimed_answer
-- A settlement with the claim of the next task riding on it: one round trip and one commit
-- per task instead of two. The two rows are distinct (the settled one is leased, so never
-- claimable). One row whatever happened: how many rows the settlement ended (0: the lease
-- is not ours) and the claimed row's columns (NULL: nothing claimed).
SELECT (SELECT count(*) FROM done) AS dequeued, c.*
FROM (SELECT 1) AS one LEFT JOIN claimed c ON true

-- fragment: settled_answer
-- A settlement alone: how many rows it ended (0: the lease is not ours).
SELECT (SELECT count(*) FROM done) AS dequeued
FROM (SELECT 1) AS one

-- fragment: settled_plain
-- A plain task's success: the fenced delete and nothing else. {unlinked}: see there.
done AS (
    DELETE FROM slotd_tasks t
    WHERE t.id = %(id)s AND t.lease_token IS NOT DISTINCT FROM %(done_token)s::uuid
      AND {unlinked}
    RETURNING t.id
)

-- predicate: unlinked
-- The plain settlements refuse a row that has dependants (marked by their enqueue, maybe
-- after this attempt was claimed) or belongs to a batch; the lifecycle then settles it by
-- the linked parts (settled_linked, failed_linked), so no dependant waits on
-- a parent gone unseen and no batch misses the end of one of its tasks.
(NOT t.has_dependants AND t.batch_id IS NULL)

-- fragment: parent_results
-- A dependant's claim brings its parents' stored values ({parent_id: value}); NULL for
-- every other row (parents_left is NULL), at the cost of one CASE.
CASE WHEN t.parents_left IS NOT NULL THEN
    (SELECT coalesce(jsonb_object_agg(e.parent_id::text, e.value), '{}'::jsonb)
     FROM slotd_dependencies e WHERE e.child_id = t.id) END AS parent_results

-- fragment: settled_plain_alone
-- settled_plain with no claim riding on it: the lone delete, answered by its row count.
-- A NULL token matches only an unleased row: the inline paths that enqueue and complete
-- a task themselves.
DELETE FROM slotd_tasks t
WHERE t.id = %(id)s AND t.lease_token IS NOT DISTINCT FROM %(done_token)s::uuid AND {unlinked}

-- fragment: attempt_recorded
-- The attempt a settlement ended, remembered (sql/030): from the statement's
-- `settled_attempt(id, task_type, number, started_at, error)`, with its outcome
-- (%(outcome)s) and this worker (%(host)s, %(pid)s, %(slot)s). Only settlements a plain
-- success never takes splice it: a plain task's hot path names no attempts table.
attempt_recorded AS (
    INSERT INTO slotd_attempts (task_id, task_type, number, outcome, error, started_at, host,
                                pid, slot)
    SELECT a.id, a.task_type, a.number, %(outcome)s::text, a.error, a.started_at,
           %(host)s::text, %(pid)s::int, %(slot)s::int
    FROM settled_attempt a
)

-- fragment: results_kept
-- The settled row's return value, stored for keep_s seconds, and the result notification
-- (the task id; sent only if the settlement commits) that wakes slotd.wait_result. Only
-- types with keep_result come here: a plain task's settlement sends no notification (one
-- takes a cluster-wide lock at commit).
kept AS (
    -- Its key and tags beside it (sql/091): a kept success is searched by them.
    INSERT INTO slotd_results (task_id, task_type, value, expires_at, key, tags)
    SELECT d.id, d.task_type, %(value)s::jsonb, now() + make_interval(secs => %(keep_s)s),
           d.key, d.tags
    FROM done d
    RETURNING task_id
), told AS (
    SELECT k.task_id, pg_notify('slotd_result', k.task_id::text) FROM kept k
), settled_attempt AS (
    SELECT d.id, d.task_type, d.number, d.started_at, NULL::text AS error FROM done d
), {attempt_recorded}

-- fragment: settled_kept
-- The success of a type that keeps its result or its history: the delete and the result's
-- insert are one statement fenced on the token, so a worker whose lease is gone writes
-- neither.
done AS (
    DELETE FROM slotd_tasks t
    WHERE t.id = %(id)s AND t.lease_token IS NOT DISTINCT FROM %(done_token)s::uuid
      AND {unlinked}
    RETURNING t.id, t.task_type, t.attempt_count AS number, t.last_attempted_at AS started_at,
              {task_key} AS key, t.tags
), {results_kept}

-- fragment: settled_kept_told
(SELECT count(*) FROM told) results

-- fragment: failure_backoff
-- Capped exponential backoff from the attempt the claim already counted, shortened by up
-- to the jitter fraction so a thousand simultaneous failures do not return together.
SELECT now() + make_interval(secs =>
    least(%(base_s)s * power(2::float8, least(greatest(t.attempt_count - 1, 0), 40)),
          %(cap_s)s) * (1 - %(jitter)s * random())) AS run_at
FROM slotd_tasks t
WHERE t.id = %(id)s AND t.lease_token = %(token)s::uuid

-- fragment: failure_written
-- %(discard)s: a payload its handler's model refused (slotd/lifecycle/, "discarded"): the
-- dead letter now, the threshold lowered to the attempts run (dead is still
-- attempt_count >= max_attempts in this release, sql/021), unless a cancel got there first.
failed AS (
    UPDATE slotd_tasks t
    SET last_error = CASE WHEN t.cancelled_at IS NULL THEN %(error)s ELSE t.last_error END,
        max_attempts = CASE WHEN %(discard)s::bool AND t.cancelled_at IS NULL
                            THEN least(t.max_attempts, t.attempt_count)
                            ELSE t.max_attempts END,
        dead_reason = CASE WHEN %(discard)s::bool AND t.cancelled_at IS NULL THEN 'discarded'
                           ELSE {exhausted_reason} END,
        dead_attempts = CASE WHEN %(discard)s::bool AND t.cancelled_at IS NULL
                             THEN t.attempt_count ELSE {exhausted_attempts} END,
        run_at = b.run_at,
        order_at = b.run_at - {head_start},
        lease_token = NULL,
        lease_expires_at = NULL
    FROM backoff b
    WHERE t.id = %(id)s AND t.lease_token = %(token)s::uuid
    RETURNING t.id, t.attempt_count, t.max_attempts, t.run_at, t.batch_id,
              t.dead_reason, t.task_type, {attempts_made} AS number,
              t.last_attempted_at AS started_at
), settled_attempt AS (
    SELECT f.id, f.task_type, f.number, f.started_at, %(error)s::text AS error FROM failed f
), {attempt_recorded}

-- fragment: failed_plain
-- A plain task's failure: backoff, or the dead letter of its last attempt. {unlinked}: a
-- row that gained dependants or a batch is refused, and settled by failed_linked.
backoff AS (
    {failure_backoff} AND {unlinked}
), {failure_written}

-- fragment: failed_answer
-- The attempt that makes the dead letter sends the result notification (slotd.wait_result).
SELECT f.attempt_count, f.max_attempts, f.run_at
FROM failed f
CROSS JOIN LATERAL (
    SELECT CASE WHEN f.attempt_count >= f.max_attempts
                THEN pg_notify('slotd_result', f.id::text) END
) n

-- name: advance_cursor
-- A slice's progress, under the lease it runs under: the payload becomes the cursor and the
-- attempt count restarts (attempts count only slices that got nowhere), and the lease stays
-- the slice's until it returns (see slotd/lifecycle/: the row is released when the
-- handler returns False, dequeued when it returns done, backed off from this cursor when it
-- raises). Refused once the task is cancelled: resetting its attempts would bring it back.
UPDATE slotd_tasks t
SET payload = %(payload)s,
    attempt_count = 0,
    last_error = NULL
WHERE t.id = %(id)s AND t.lease_token = %(token)s::uuid AND t.cancelled_at IS NULL

-- name: record_step
-- A durable step's value (ctx.step, #38), appended to the task's steps under the lease the
-- attempt runs under, before the handler goes on: a worker that lost its lease stores
-- nothing (the handler is told, LeaseLost), and a cancelled task takes no more steps.
-- %(index)s is the step's place in the run: the write appends only at that place, and a
-- retry of a write whose answer was lost (the slot reconnects, see slotd/lifecycle/,
-- "answer lost") finds its own step already there and matches without a second copy.
UPDATE slotd_tasks t
SET steps = CASE WHEN jsonb_array_length(coalesce(t.steps, '[]'::jsonb)) = %(index)s::int
                 THEN coalesce(t.steps, '[]'::jsonb) || jsonb_build_array(jsonb_build_object(
                     'name', %(name)s::text, 'value', %(value)s::jsonb, 'at', now()))
                 ELSE t.steps END
WHERE t.id = %(id)s AND t.lease_token = %(token)s::uuid AND t.cancelled_at IS NULL
  AND (jsonb_array_length(coalesce(t.steps, '[]'::jsonb)) = %(index)s::int
       OR t.steps -> %(index)s::int ->> 'name' = %(name)s::text)

-- name: event_lock
-- Taken by its own statement before `wait_step` looks for an event, in the same transaction,
-- as slotd_emit (sql/072) takes it before it writes one: the look's snapshot then sees an
-- emit that held the lock before, and an emit after it sees this wait (see sql/072).
SELECT pg_advisory_xact_lock(hashtextextended('slotd.event:' || %(event)s::text, 0))

-- name: wait_step
-- A durable sleep or event wait (ctx.sleep, ctx.wait_event; slotd/lifecycle/, "suspended"),
-- fenced on the lease, at place %(index)s of the task's steps, in ONE statement: it looks for
-- the event (kept in slotd_events since its emit) and decides, so no emit is ever missed:
--   event    the event was emitted: its data is stored as the step's value; the attempt
--            goes on;
--   due      the task was suspended on this very step and its wake time has come (a
--            sleep served, an event's timeout passed): the step's value is null; goes on;
--   suspend  the wait is registered (wait_step, wait_event, wait_until; the wake time
--            kept from an earlier suspension on the same step), the lease released, the
--            task due at the wake time ('infinity': an event without a timeout, made due
--            by its emit), and the attempt its claim burnt given back: a wait is not an
--            attempt. The attempt then ends (outcome suspended) and frees its slot.
-- Nothing matches when the lease is not ours, the task was cancelled, or the steps stored
-- are not the %(index)s this run replayed (a concurrent attempt's).
WITH held AS (
    SELECT t.id, t.wait_step, t.wait_until FROM slotd_tasks t
    WHERE t.id = %(id)s AND t.lease_token = %(token)s::uuid AND t.cancelled_at IS NULL
      AND jsonb_array_length(coalesce(t.steps, '[]'::jsonb)) = %(index)s::int
), emitted AS (
    SELECT e.data FROM slotd_events e
    WHERE %(event)s::text IS NOT NULL AND e.name = %(event)s::text
    ORDER BY e.id DESC LIMIT 1
), decided AS (
    SELECT h.id,
           CASE WHEN EXISTS (SELECT 1 FROM emitted) THEN 'event'
                WHEN h.wait_step = %(name)s::text AND h.wait_until <= now() THEN 'due'
                ELSE 'suspend' END AS verdict,
           CASE WHEN h.wait_step = %(name)s::text THEN h.wait_until
                ELSE now() + make_interval(secs => %(for_s)s::float8) END AS wake_at
    FROM held h
), written AS (
    UPDATE slotd_tasks t
    SET steps = CASE WHEN d.verdict = 'suspend' THEN t.steps
                     ELSE coalesce(t.steps, '[]'::jsonb) || jsonb_build_array(jsonb_build_object(
                         'name', %(name)s::text,
                         'value', coalesce((SELECT e.data FROM emitted e), 'null'::jsonb),
                         'at', now())) END,
        wait_step = CASE WHEN d.verdict = 'suspend' THEN %(name)s::text END,
        wait_event = CASE WHEN d.verdict = 'suspend' THEN %(event)s::text END,
        wait_until = CASE WHEN d.verdict = 'suspend' THEN d.wake_at END,
        run_at = CASE WHEN d.verdict = 'suspend' THEN coalesce(d.wake_at, 'infinity')
                      ELSE t.run_at END,
        order_at = CASE WHEN d.verdict <> 'suspend' THEN t.order_at
                        WHEN d.wake_at IS NULL THEN 'infinity'
                        ELSE d.wake_at - {head_start} END,
        attempt_count = CASE WHEN d.verdict = 'suspend' THEN greatest(t.attempt_count - 1, 0)
                             ELSE t.attempt_count END,
        lease_token = CASE WHEN d.verdict = 'suspend' THEN NULL ELSE t.lease_token END,
        lease_expires_at = CASE WHEN d.verdict = 'suspend' THEN NULL
                                ELSE t.lease_expires_at END
    FROM decided d
    WHERE t.id = d.id
    RETURNING d.verdict
)
SELECT w.verdict, (SELECT e.data FROM emitted e) FROM written w

-- name: emit
SELECT slotd_emit(%(name)s::text, %(data)s::jsonb)

-- name: events_prune
-- Emits older than the retention (SLOTD_RETENTION): a wait that begins later misses them.
DELETE FROM slotd_events e
WHERE e.id IN (SELECT x.id FROM slotd_events x
               WHERE x.emitted_at < now() - make_interval(secs => %(retention_s)s)
               LIMIT %(batch)s)

-- name: snooze
-- A handler's `raise slotd.Snooze(td)` (slotd/lifecycle/, "snoozed"): the lease goes, the
-- task is due again after the delay, the attempt its claim burnt is given back (a snooze is
-- not a failure: it never brings the dead letter closer) and its snoozes counted. Fenced on
-- the lease; refused for a cancelled task (its slot settles the cancel) and, once the task
-- has snoozed %(max_snoozes)s times, left for the lifecycle to end as a dead letter: the
-- answer says which (no row: not ours or cancelled; snoozed false: past the cap).
WITH held AS (
    SELECT t.id, t.snoozes FROM slotd_tasks t
    WHERE t.id = %(id)s AND t.lease_token = %(token)s::uuid AND t.cancelled_at IS NULL
), snoozed AS (
    UPDATE slotd_tasks t
    SET run_at = now() + make_interval(secs => %(delay_s)s),
        order_at = now() + make_interval(secs => %(delay_s)s) - {head_start},
        attempt_count = greatest(t.attempt_count - 1, 0),
        snoozes = t.snoozes + 1,
        lease_token = NULL,
        lease_expires_at = NULL
    FROM held h
    WHERE t.id = h.id AND h.snoozes < %(max_snoozes)s
    RETURNING t.id
)
SELECT h.snoozes, EXISTS (SELECT 1 FROM snoozed) FROM held h

-- name: continue_slice
-- The end of a slice that advanced and returned False: the lease goes and the row is due at
-- once, from its cursor, waking a slot (here or on another replica) in the same transaction.
-- Refused for a cancelled task (cancelled_at): its cancel came after the advance, and
-- clearing its lease here would end it uncounted (its batch never called back); its slot
-- settles it as the cancel's end instead (settle_cancelled, slotd/lifecycle/).
WITH continued AS (
    UPDATE slotd_tasks t
    SET run_at = now(),
        order_at = now() - {head_start},
        lease_token = NULL,
        lease_expires_at = NULL
    WHERE t.id = %(id)s AND t.lease_token = %(token)s::uuid AND t.cancelled_at IS NULL
    RETURNING t.id, t.attempt_count < t.max_attempts AS retryable
)
SELECT c.id FROM continued c
LEFT JOIN LATERAL (SELECT pg_notify('slotd_wake', '')) n ON c.retryable

-- predicate: refunds_final
-- A shutdown's release of a final attempt not refunded before (see `release`).
(%(refund_final)s::bool AND t.attempt_count >= t.max_attempts AND t.cancelled_at IS NULL
 AND NOT t.final_attempt_refunded)

-- predicate: refunds_unstarted
-- A release of a claim whose handler never started, of a task not cancelled meanwhile: a
-- cancelled row keeps the threshold its cancel raised it to, or the refund would revive it.
(%(unstarted)s::bool AND t.cancelled_at IS NULL)

-- name: release
-- A rollout does not refund the attempt (an interruption costs one, or a task always
-- mid-flight at rollout would never dead-letter), with one bounded exception: a release that
-- would make the dead letter, on the final attempt, gives that attempt back, once per task
-- (final_attempt_refunded, sql/017), so a deploy is never what kills a task. A second such
-- release dead-letters it, and the reason is stamped then, else the dead letter would carry
-- no explanation. refund_final: only a shutdown's release (not the test clock's lapse).
-- unstarted: the claim met the shutdown before its handler started: its attempt is given
-- back, whatever it was, since nothing ran (unless it was cancelled meanwhile). A released
-- row is due at once, so the release wakes a slot (here or on another replica) in the same
-- transaction instead of leaving the work to the next tick.
-- A release that makes the dead letter of a task with dependants cancels them, as its
-- failure would (failed_linked), and a batch's task is counted as ended: gated on
-- the row's own has_dependants and batch_id, read under the row lock, so a plain task's
-- release reads no other table.
WITH RECURSIVE released AS (
    UPDATE slotd_tasks t
    SET lease_token = NULL,
        lease_expires_at = NULL,
        attempt_count = CASE WHEN {refunds_unstarted} THEN greatest(t.attempt_count - 1, 0)
                             WHEN {refunds_final} THEN t.max_attempts - 1
                             ELSE t.attempt_count END,
        final_attempt_refunded = t.final_attempt_refunded OR {refunds_final},
        last_error = CASE WHEN t.attempt_count >= t.max_attempts AND t.cancelled_at IS NULL
                               AND NOT {refunds_final} AND NOT {refunds_unstarted}
                          THEN %(reason)s ELSE t.last_error END,
        dead_reason = CASE WHEN {refunds_final} OR {refunds_unstarted} THEN NULL
                           ELSE {exhausted_reason} END,
        dead_attempts = CASE WHEN {refunds_final} OR {refunds_unstarted} THEN NULL
                             ELSE {exhausted_attempts} END
    WHERE t.id = %(id)s AND t.lease_token = %(token)s::uuid
    RETURNING t.id, t.attempt_count < t.max_attempts AS retryable, t.has_dependants,
              t.batch_id, t.dead_reason, t.task_type, {attempts_made} AS number,
              t.last_attempted_at AS started_at
), settled_attempt AS (
    -- An attempt the shutdown interrupted; a claim whose handler never started ran nothing.
    SELECT r.id, r.task_type, r.number, r.started_at, NULL::text AS error
    FROM released r WHERE NOT %(unstarted)s::bool
), {attempt_recorded}, doomed(id, root) AS (
    SELECT e.child_id, r.id FROM released r JOIN slotd_dependencies e ON e.parent_id = r.id
    WHERE r.has_dependants AND NOT r.retryable
    UNION
    SELECT e.child_id, d.root FROM slotd_dependencies e JOIN doomed d ON e.parent_id = d.id
), {dependants_cancelled}, ended AS (
    SELECT r.id, r.batch_id, CASE r.dead_reason WHEN 'exhausted' THEN 'failed'
                WHEN 'expired' THEN 'expired' ELSE 'cancelled' END AS outcome
    FROM released r WHERE r.batch_id IS NOT NULL AND NOT r.retryable
    UNION ALL
    SELECT c.id, c.batch_id, 'cancelled' FROM cancelled c WHERE c.batch_id IS NOT NULL
), {batch_counted}, seq_ended(id, sequence, halts) AS (
    -- A sequence's member made a dead letter: its sequence halts, or goes on (sql/080).
    SELECT r.id, m.sequence, r.dead_reason = 'exhausted' AND NOT %(sequence_go_on)s::bool
    FROM released r JOIN slotd_tasks m ON m.id = r.id
    WHERE NOT r.retryable AND m.sequence IS NOT NULL
), {sequence_moved}
SELECT r.id, NOT r.retryable AS dead FROM released r
LEFT JOIN LATERAL (SELECT pg_notify('slotd_wake', '')) n ON r.retryable
CROSS JOIN LATERAL (
    SELECT CASE WHEN NOT r.retryable THEN pg_notify('slotd_result', r.id::text) END
) ended
CROSS JOIN (SELECT count(*) FROM told) cascaded
CROSS JOIN (SELECT count(*) FROM batch_woken) callbacks

-- fragment: live_types
-- The types with live rows, by a loose index scan of a per-type partial index (one descent
-- per type, never a read of the rows), for the per-type oldest-due reads. Its last row is
-- NULL (the descent that found no further type): readers skip it.
RECURSIVE live_types(task_type) AS (
    (SELECT t.task_type FROM slotd_tasks t WHERE {retryable}
     ORDER BY t.task_type LIMIT 1)
    UNION ALL
    SELECT (SELECT t.task_type FROM slotd_tasks t
            WHERE {retryable} AND t.task_type > l.task_type
            ORDER BY t.task_type LIMIT 1)
    FROM live_types l WHERE l.task_type IS NOT NULL
)

-- fragment: rate_rows
-- Rates (sql/022), each type's own window, for the gauges, `slotd status` and the dashboard: starts in it now (at most `allowed` rows read),
-- the limit the last start was made under, seconds until the next start may come (0: now).
-- Per group: how many groups' windows are full right now. A few rows, from the windows.
SELECT k.kind, w.task_type, k.value
FROM slotd_rate_windows w
CROSS JOIN LATERAL (VALUES
    ('rate_used', (SELECT count(*) FROM slotd_rate_starts rs
                   WHERE rs.task_type = w.task_type AND NOT rs.per_group
                     AND rs.task_group = ''
                     AND rs.started_at > now() - make_interval(secs => w.window_s))::float8),
    ('rate_allowed', w.allowed::float8),
    ('rate_window_s', w.window_s),
    ('rate_free_s', greatest(extract(epoch FROM w.free_at - now())::float8, 0))
) AS k(kind, value)
WHERE NOT w.per_group
UNION ALL
SELECT 'rate_groups_full', w.task_type, count(*)
FROM slotd_rate_windows w WHERE w.per_group AND w.free_at > now()
GROUP BY w.task_type

-- name: gauges
-- One round trip for every fleet gauge; each branch is driven by its own partial index.
WITH {live_types}
SELECT 'pending' AS kind, t.task_type, count(*)::float8 AS value
FROM slotd_tasks t WHERE {retryable} GROUP BY t.task_type
UNION ALL
SELECT 'pending', t.task_type, count(*)
FROM slotd_tasks t WHERE {final_running}
GROUP BY t.task_type
UNION ALL
SELECT 'running', t.task_type, count(*)
FROM slotd_tasks t WHERE {running}
GROUP BY t.task_type
UNION ALL
SELECT 'dead', t.task_type, count(*)
FROM slotd_tasks t WHERE {dead} GROUP BY t.task_type
UNION ALL
SELECT 'paused', p.task_type, 1 FROM slotd_paused_types p WHERE {pause_active}
UNION ALL
{rate_rows}
UNION ALL
SELECT 'oldest_due', NULL, coalesce(extract(epoch FROM now() - (
    -- The wait of the task that runs next: exact without priorities; with them it may
    -- read up to 200 x the step less than the longest wait (see README, Priorities).
    -- Rows held back only by their own limit are not waiting on the fleet: left out.
    -- Each live type's first row by the ordering key (slotd_tasks_order_by_type), then the
    -- first of those: the same row as one ordered scan over all types would find.
    SELECT first.run_at FROM live_types l
    CROSS JOIN LATERAL (
        SELECT t.run_at, t.order_at, t.id FROM slotd_tasks t
        WHERE t.task_type = l.task_type
          AND {claimable} AND {in_order_window} AND {within_limits}
        ORDER BY t.order_at, t.id LIMIT 1
    ) first
    WHERE l.task_type IS NOT NULL
      -- Nor is work of a type whose rate window is full: it waits on its own rate.
      AND l.task_type NOT IN (SELECT w.task_type FROM slotd_rate_windows w
                              WHERE NOT w.per_group AND w.free_at > now())
    ORDER BY first.order_at, first.id LIMIT 1))::float8, 0)

-- name: dead_list
SELECT t.id, t.task_type, {task_key} AS key, t.payload, {attempts_made} AS attempt_count,
       t.last_error, t.last_attempted_at, t.created_at, t.cancelled_at,
       {dead_reason} AS dead_reason
FROM slotd_tasks t
WHERE {dead} AND (%(task_type)s::text IS NULL OR t.task_type = %(task_type)s)
  AND (%(ids)s::bigint[] IS NULL OR t.id = ANY(%(ids)s::bigint[]))
  -- A key is looked up through slotd_tasks_key (and slotd_tasks_started_key), hence the
  -- type list it is searched in.
  AND (%(key)s::text IS NULL OR ((t.key = %(key)s OR t.started_key = %(key)s)
                                 AND t.task_type = ANY(%(key_types)s::text[])))
ORDER BY {retired_at} DESC NULLS LAST, t.id DESC
LIMIT %(limit)s

-- name: task_list
-- slotd.tasks: the queue's rows (live and dead letters; a succeeded task is gone) matching
-- every filter given, newest first. A tag is found through slotd_tasks_tags (sql/040), a
-- type through the type-led indexes; a state alone reads the table (an operator's look).
-- `before`: the next page starts below the previous page's last id (a keyset, as the
-- dashboard pages), never an OFFSET.
SELECT t.id, t.task_type, {task_key} AS key, {task_state} AS state, t.payload, t.tags,
       t.priority, t.task_group, {attempts_made} AS attempts, t.max_attempts, {shown_run_at},
       t.created_at, t.last_error, {dead_reason} AS dead_reason
FROM slotd_tasks t
WHERE (%(task_type)s::text IS NULL OR t.task_type = %(task_type)s)
  AND (%(before)s::bigint IS NULL OR t.id < %(before)s)
  AND (%(key)s::text IS NULL OR t.key = %(key)s OR t.started_key = %(key)s)
  AND {tagged}
  AND (%(state)s::text IS NULL OR {task_state} = %(state)s)
ORDER BY t.id DESC
LIMIT %(limit)s

-- name: dead_retry
-- Back to the start: attempts reset and due now. A keyed dead letter is revived only while
-- no live row has its key (the full live predicate: a row on its final attempt under a
-- lease is live too), and of several dead letters sharing a key only the newest: reviving
-- two would duplicate the work and break the dedupe index. The ones left out are left out
-- of the batch too, so a batch is never spent on rows it cannot revive.
-- A unique="pending" dead letter that ran keeps its key in started_key (sql/016): its key
-- is that one, checked and given back (it is pending again). Only ended dead letters
-- ({ended}): a final attempt whose lease lapsed unsettled is ended first, by the lapse
-- statement the caller runs before this one (slotd/repository/control.py).
WITH candidates AS MATERIALIZED (
    SELECT d.id, d.task_type, coalesce(d.key, d.started_key) AS key FROM slotd_tasks d
    WHERE d.id IN (
        SELECT t.id FROM slotd_tasks t
        WHERE {dead} AND {ended} AND (%(task_type)s::text IS NULL OR t.task_type = %(task_type)s)
          AND (%(ids)s::bigint[] IS NULL OR t.id = ANY(%(ids)s::bigint[])))
      AND (coalesce(d.key, d.started_key) IS NULL OR NOT EXISTS (
          SELECT 1 FROM slotd_tasks t
          WHERE t.task_type = d.task_type AND t.key = coalesce(d.key, d.started_key)
            AND t.id <> d.id AND {live}))
    ORDER BY d.id LIMIT %(batch)s FOR UPDATE OF d SKIP LOCKED
), chosen AS (
    SELECT DISTINCT ON (c.task_type, c.key, CASE WHEN c.key IS NULL THEN c.id END) c.id
    FROM candidates c
    ORDER BY c.task_type, c.key, CASE WHEN c.key IS NULL THEN c.id END, c.id DESC
)
UPDATE slotd_tasks t
SET attempt_count = 0,
    -- A member of a sequence whose sequence has an active member now (due, running,
    -- retrying: not waiting) waits its turn (sql/080), so two never run at once; its place
    -- comes before the others', so it runs next.
    run_at = CASE WHEN q.busy THEN 'infinity' ELSE now() END,
    sequence_waiting = coalesce(q.busy, false),
    -- A dependant cancelled while it waited has run_at = order_at = 'infinity' (sql/019):
    -- no head start to keep, and infinity - infinity is an error.
    order_at = CASE WHEN q.busy THEN 'infinity'
               ELSE now() - CASE WHEN isfinite(t.run_at) THEN {head_start} ELSE interval '0' END
               END,
    key = coalesce(t.key, t.started_key),
    started_key = CASE WHEN t.unique_pending THEN NULL ELSE t.started_key END,
    lease_token = NULL, lease_expires_at = NULL, cancelled_at = NULL,
    -- A dead letter its batch counted (a settlement wrote its reason) runs on its own now:
    -- counting it again would end the batch twice. One that no settlement made dead (its
    -- final lease lapsed with its whole replica gone; written by no statement, so never
    -- counted, sql/021) stays in its batch, which completes when it ends.
    batch_id = CASE WHEN t.dead_reason IS NULL THEN t.batch_id END,
    dead_reason = NULL, dead_attempts = NULL,
    snoozes = 0,  -- a retried task snoozes its full count again (sql/071)
    -- An operator's retry of an expired task means "run it anyway": its expiry goes.
    expires_at = NULL,
    final_attempt_refunded = false  -- a fresh start: a rollout may give one back again
FROM chosen
LEFT JOIN LATERAL (
    SELECT EXISTS (SELECT 1 FROM slotd_tasks t
                   WHERE t.sequence = x.sequence AND t.id <> x.id AND NOT t.sequence_waiting
                     AND {sequence_holding}) AS busy
    FROM slotd_tasks x WHERE x.id = chosen.id AND x.sequence IS NOT NULL
) q ON true
WHERE t.id = chosen.id
RETURNING t.id

-- name: dead_purge
-- Ended dead letters only ({ended}): see dead_retry. A purged member that halted its
-- sequence ends the halt, and the sequence goes on (sql/080), under the sequences' locks
-- taken first (sequence_lock_targets).
WITH purged AS (
    DELETE FROM slotd_tasks t
    WHERE t.id IN (
        SELECT t.id FROM slotd_tasks t
        WHERE {dead} AND {ended}
          AND (%(task_type)s::text IS NULL OR t.task_type = %(task_type)s)
          AND (%(ids)s::bigint[] IS NULL OR t.id = ANY(%(ids)s::bigint[]))
          AND (%(older_than_s)s::float8 IS NULL
               OR {retired_at} < now() - make_interval(secs => %(older_than_s)s))
        ORDER BY t.id LIMIT %(batch)s FOR UPDATE SKIP LOCKED)
    RETURNING t.id, t.sequence
), seq_ended(id, sequence, halts) AS (
    SELECT p.id, p.sequence, false FROM purged p WHERE p.sequence IS NOT NULL
), {sequence_moved}
SELECT count(*) FROM purged

-- name: dead_count
SELECT count(*) FROM slotd_tasks t
WHERE {dead} AND (%(task_type)s::text IS NULL OR t.task_type = %(task_type)s)
  AND (%(ids)s::bigint[] IS NULL OR t.id = ANY(%(ids)s::bigint[]))
  AND (%(older_than_s)s::float8 IS NULL
       OR {retired_at} < now() - make_interval(secs => %(older_than_s)s))

-- name: replica_heartbeat
-- The replica's one periodic statement: its row (who it is, which slot holds which lease),
-- and two readings handed back to its supervisor, so an idle replica sends nothing else
-- between its discoveries (tests/bench/idle_cost.py). lapse_s: seconds until the soonest
-- final attempt's lease lapses (negative: lapsed; NULL: none), the lapse sweep's cue
-- (slotd/lifecycle/, "lapsed"): it reads the leases through slotd_tasks_leased_group as the
-- sweep did each heartbeat, and the sweep's writes now run only when one has lapsed. The
-- horizon's holder (fragment horizon_holders) when %(horizon)s, else no row of it (a one-time
-- filter: the views are not read).
WITH beat AS (
    INSERT INTO slotd_replicas AS r
        (replica_id, hostname, pid, slots, task_types, leases, limits, version, migration)
    VALUES (%(replica_id)s, %(hostname)s, %(pid)s, %(slots)s, %(task_types)s,
            %(leases)s::jsonb, %(limits)s::jsonb, %(version)s, %(migration)s)
    ON CONFLICT (replica_id) DO UPDATE
    SET seen_at = now(), slots = excluded.slots, task_types = excluded.task_types,
        leases = excluded.leases, limits = excluded.limits, version = excluded.version,
        migration = excluded.migration
    RETURNING r.replica_id
)
SELECT (SELECT count(*) FROM beat) AS beat,
       (SELECT extract(epoch FROM min(t.lease_expires_at) - now())::float8
        FROM slotd_tasks t
        WHERE t.lease_token IS NOT NULL AND t.attempt_count >= t.max_attempts) AS lapse_s,
       h.kind, h.pid, h.who, h.state, h.age_s, h.xids
FROM (SELECT 1) AS one
LEFT JOIN (SELECT * FROM ({horizon_holders}) hh WHERE %(horizon)s) h ON true

-- name: replica_gone
DELETE FROM slotd_replicas WHERE replica_id = %(replica_id)s

-- fragment: horizon_holders
-- What holds back the database's xmin horizon the longest: the session, replication slot or
-- prepared transaction with the oldest xmin (this session aside). While one does, vacuum can
-- remove nothing that died after it began, and every finished task's index entries stay in
-- the queue's indexes (README, "A transaction held open"). A session holds it by its
-- snapshot or, idle after a write, by its own xid; its age is its transaction's (a
-- walsender's, for a standby's hot_standby_feedback, has none). A replication slot's age is
-- unknown, only its distance in transactions. Read on the primary, each heartbeat, by every
-- replica: pg_stat_activity, pg_replication_slots and pg_prepared_xacts are small views.
SELECT kind, pid, who, state, age_s, xids
FROM (
    SELECT 'session' AS kind, a.pid,
           coalesce(nullif(a.application_name, ''), a.backend_type, a.usename::text, '?') AS who,
           coalesce(a.state, a.backend_type, '?') AS state,
           extract(epoch FROM now() - a.xact_start)::float8 AS age_s,
           greatest(age(a.backend_xmin), age(a.backend_xid))::bigint AS xids
    FROM pg_stat_activity a
    WHERE (a.backend_xmin IS NOT NULL OR a.backend_xid IS NOT NULL)
      AND a.pid <> pg_backend_pid()
    UNION ALL
    SELECT 'replication slot', NULL, s.slot_name::text,
           CASE WHEN s.active THEN 'active' ELSE 'inactive' END, NULL,
           greatest(age(s.xmin), age(s.catalog_xmin))::bigint
    FROM pg_replication_slots s
    WHERE s.xmin IS NOT NULL OR s.catalog_xmin IS NOT NULL
    UNION ALL
    SELECT 'prepared transaction', NULL, p.gid, 'prepared',
           extract(epoch FROM now() - p.prepared)::float8, age(p.transaction)::bigint
    FROM pg_prepared_xacts p
) holders
ORDER BY xids DESC, age_s DESC NULLS LAST
LIMIT 1

-- name: horizon_holder
-- `slotd status`'s reading; a replica reads it with its heartbeat (replica_heartbeat).
{horizon_holders}

-- name: replicas
-- A replica heartbeats every SLOTD_HEARTBEAT_INTERVAL (30 s, always under a minute); one
-- silent for a minute is gone, and is
-- pruned here so the table never accumulates crashed replicas.
WITH pruned AS (
    DELETE FROM slotd_replicas WHERE seen_at < now() - interval '10 minutes'
)
{live_replicas}

-- name: dash_replicas
-- The live replicas without the prune: the dashboard may read from a hot standby.
{live_replicas}

-- fragment: live_replicas
SELECT replica_id, hostname, pid, slots, task_types, leases, limits, version, migration,
       extract(epoch FROM now() - seen_at)::float8 AS seen_ago_s
FROM slotd_replicas
WHERE seen_at >= now() - interval '1 minute'
ORDER BY hostname, pid

-- name: elect_chore
-- Returns a row on exactly one replica per period: the first to arrive after it elapsed.
INSERT INTO slotd_maintenance AS m (chore, last_run_at) VALUES (%(chore)s, now())
ON CONFLICT (chore) DO UPDATE SET last_run_at = now()
WHERE m.last_run_at <= now() - make_interval(secs => %(period_s)s)
RETURNING m.last_run_at

-- name: migrate_lock
-- Released by the transaction's end, never by a separate statement a pooler could route
-- to another server session.
SELECT pg_advisory_xact_lock(hashtext('slotd.migrate'))

-- name: migrate_schema_create
-- A named SLOTD_SCHEMA (never public) is created by the migration that fills it, under
-- migrate_lock: two hosts creating it at once would otherwise race on pg_namespace.
CREATE SCHEMA IF NOT EXISTS slotd_schema_name

-- name: migrate_search_path_set
-- The migration transaction's search_path: the named schema alone (see migrate), and what
-- it was, to put back.
SELECT current_setting('search_path'), set_config('search_path', 'slotd_schema_name', true)

-- name: migrate_search_path_reset
SELECT set_config('search_path', %(was)s, true)

-- name: migrate_init
CREATE TABLE IF NOT EXISTS slotd_schema_migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)

-- name: migrate_applied
SELECT version FROM slotd_schema_migrations ORDER BY version

-- name: migrate_fleet
-- The live replicas as whole rows, whichever columns this schema has so far: a contract
-- step's guard runs before or after sql/013 added the version columns.
SELECT to_jsonb(r) FROM slotd_replicas r WHERE seen_at >= now() - interval '1 minute'

-- name: migrate_lock_timeout_set
-- How long each step may wait for a table lock, for this transaction only, set after
-- migrate_lock (a second `slotd migrate` waits its turn on that one, unbounded). A step that
-- alters a table queues for an ACCESS EXCLUSIVE lock behind whatever holds the table (a
-- replica's transaction, a report, a held-open session), and while it waits every later
-- lock on that table waits behind it: every enqueue and claim of a live fleet stops for as
-- long as the oldest holder lasts. Bounded (500 ms by default, under deadlock_timeout's 1 s),
-- the step gives up instead, the whole migration rolls back (nothing applied), and
-- slotd.live_migrate tries again after a pause, so a fleet stalls at most the bound per try.
SELECT set_config('lock_timeout', %(lock_timeout)s, true)

-- name: migrate_lock_holders
-- Who holds locks on slotd's tables (other than this session), oldest transaction first:
-- what `slotd migrate` names when a step could not take its lock in time. Read after the
-- failed try rolled back, so a holder that has ended since is not named.
SELECT a.pid,
       coalesce(nullif(a.application_name, ''), a.usename::text, '?') AS who,
       coalesce(a.state, '?') AS state,
       extract(epoch FROM now() - coalesce(a.xact_start, a.backend_start))::float8 AS age_s,
       string_agg(DISTINCT c.relname, ',' ORDER BY c.relname) AS tables
FROM pg_locks l
JOIN pg_class c ON c.oid = l.relation
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.granted AND l.pid <> pg_backend_pid() AND l.locktype = 'relation'
  AND n.nspname = %(schema)s AND c.relname LIKE 'slotd%%'
GROUP BY a.pid, a.application_name, a.usename, a.state, a.xact_start, a.backend_start
ORDER BY age_s DESC
LIMIT 5

-- name: migrate_record
INSERT INTO slotd_schema_migrations (version, name) VALUES (%(version)s, %(name)s)

-- name: listen
LISTEN slotd_wake

-- name: listen_control
-- Operator control: cancels to route to the slot holding the lease, pauses to log.
LISTEN slotd_control

-- name: notify_selftest
-- Sent by the supervisor on the primary after each LISTEN: proves that a notification
-- reaches the LISTEN connection (it does not through a transaction-mode pooler).
SELECT pg_notify('slotd_wake', %(payload)s)

-- name: backend_pid
-- Compared with the pid the server announced at startup: a pooler announces its own.
SELECT pg_backend_pid()

-- name: set_time_offset
-- Test modes only: shift this session's idea of now() is impossible, so the manual queue
-- moves the rows instead (see testing.advance_time).
UPDATE slotd_tasks t
SET run_at = t.run_at - make_interval(secs => %(seconds)s),
    order_at = t.order_at - make_interval(secs => %(seconds)s),
    lease_expires_at = t.lease_expires_at - make_interval(secs => %(seconds)s),
    last_attempted_at = t.last_attempted_at - make_interval(secs => %(seconds)s)

-- name: expire_leases
UPDATE slotd_tasks t SET lease_expires_at = now() - interval '1 microsecond'
WHERE t.lease_token IS NOT NULL AND {lease_live}

-- name: oldest_due_by_type
-- `slotd status` only, never a scrape: per-type wait, the same claimable predicate as the
-- oldest-due gauge. Per live type, its earliest due row through slotd_tasks_due_by_type
-- (sql/010): one range scan per type, stopping at the first claimable row.
WITH {live_types}
SELECT l.task_type, extract(epoch FROM now() - first.run_at)::float8 AS oldest_due_s
FROM live_types l
CROSS JOIN LATERAL (
    SELECT t.run_at FROM slotd_tasks t
    WHERE t.task_type = l.task_type AND {claimable} AND {in_order_window}
    ORDER BY t.run_at LIMIT 1
) first
WHERE l.task_type IS NOT NULL

-- name: schema_present
SELECT to_regclass('slotd_tasks') IS NOT NULL

-- name: gauges_serial
-- SET LOCAL for the gauge refresh's transaction: parallel workers would triple the CPU a
-- background count takes from the primary for no gain in what the scrape reports.
SELECT set_config('max_parallel_workers_per_gather', '0', true)

-- name: task_view
-- Test modes' views, one row shape for all three: 'pending' (every live task), 'running'
-- (under a live lease), both in delivery order; 'dead' (dead letters), newest first.
SELECT t.id, t.task_type, t.payload, t.attempt_count, {task_key}, {shown_run_at}, t.last_error,
       {dead} AS dead
FROM slotd_tasks t
WHERE (%(task_type)s::text IS NULL OR t.task_type = %(task_type)s)
  AND CASE %(view)s::text
        WHEN 'dead' THEN {dead}
        WHEN 'running' THEN {live} AND t.lease_token IS NOT NULL AND {lease_live}
        ELSE {live}
      END
ORDER BY CASE WHEN %(view)s::text = 'dead' THEN t.last_attempted_at END DESC NULLS LAST,
         CASE WHEN %(view)s::text = 'dead' THEN -t.id END, t.run_at, t.id

-- name: held_lease
-- The lease a chained claim took under this token, if its statement committed: what a slot
-- asks after its connection dropped with the answer unread, instead of leaving the row
-- leased to nobody until ceiling + margin. claimed_at: the claim's own stamp.
SELECT t.id, t.task_type, t.payload, {task_key}, t.run_at, t.attempt_count, t.max_attempts,
       t.lease_token, t.lease_expires_at, t.last_attempted_at AS claimed_at,
       t.trace_context, t.has_dependants, {parent_results}, t.batch_id, t.steps,
       -- The lease a lost claim took over is not known any more: its lapse goes unrecorded.
       NULL::timestamptz AS lapsed_at, NULL::timestamptz AS lapsed_started
FROM slotd_tasks t
WHERE t.lease_token = %(token)s::uuid AND {lease_live}

-- name: lease_of
SELECT t.lease_token, {lease_live} FROM slotd_tasks t WHERE t.id = %(id)s

-- name: ping
-- Proves a connection alive (the LISTEN socket can die silently) and opens a transaction
-- on a non-autocommit one.
SELECT 1

-- name: database_exists
SELECT 1 FROM pg_database WHERE datname = %(name)s

-- name: waiting_for
-- Test modes' lock watch: sessions waiting for a lock that session %(holder)s holds.
SELECT a.pid FROM pg_stat_activity a
WHERE a.pid <> pg_backend_pid() AND %(holder)s::int = ANY(pg_blocking_pids(a.pid))

-- name: cancel_backend
SELECT pg_cancel_backend(%(pid)s)

-- name: cancel
-- An operator's cancel, in the caller's transaction. Raising attempt_count to the threshold
-- makes the row dead by {dead} as soon as no live lease holds it: it leaves the discovery
-- and dedupe indexes, no claim can take it ({claimable} wants attempts left), and the dead
-- letter gauge, listing, retention and retry all see it with its reason. FOR UPDATE without
-- SKIP LOCKED: a claim racing this cancel either commits first (then this waits for it,
-- re-reads the leased row and cancels the running attempt) or meets the cancelled row and
-- leaves it. A running row keeps its lease, so its slot still settles it fenced; the
-- control notification (sent only if this commits) tells the replica holding it.
WITH target AS (
    SELECT t.id FROM slotd_tasks t
    WHERE (%(ids)s::bigint[] IS NULL OR t.id = ANY(%(ids)s::bigint[]))
      AND (%(task_type)s::text IS NULL OR t.task_type = %(task_type)s)
      AND (%(key)s::text IS NULL OR t.key = %(key)s OR t.started_key = %(key)s)
      AND {live}
    ORDER BY t.id LIMIT %(batch)s
    FOR UPDATE
), cancelled AS (
    UPDATE slotd_tasks t
    SET attempt_count = greatest(t.attempt_count, t.max_attempts),
        dead_reason = 'cancelled',
        dead_attempts = t.attempt_count,
        cancelled_at = now(),
        -- A lease that is not live is no lease: its holder froze or died, and this cancel
        -- is the task's end (counted below). Left in place, the lapse sweep would read a
        -- final attempt's lapsed lease and end the task a second time.
        lease_token = CASE WHEN {lease_live} THEN t.lease_token END,
        lease_expires_at = CASE WHEN {lease_live} THEN t.lease_expires_at END,
        last_error = format('cancelled by %%s at %%s %%s', %(by)s::text,
            to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
            CASE WHEN {lease_live} THEN format('while attempt %%s was running', t.attempt_count)
                 ELSE format('after %%s attempt(s)', t.attempt_count) END)
    FROM target
    WHERE t.id = target.id
    RETURNING t.id, t.task_type, t.lease_token, t.lease_token IS NOT NULL AS running,
              t.batch_id
), ended AS (
    -- A batch's task that was not running has ended here; a running one ends when its
    -- slot settles it (settle_cancelled, or a success if its handler finished anyway).
    SELECT c.id, c.batch_id, 'cancelled' AS outcome FROM cancelled c
    WHERE c.batch_id IS NOT NULL AND NOT c.running
), {batch_counted}
SELECT c.id, c.task_type, c.running
FROM cancelled c
CROSS JOIN (SELECT count(*) FROM batch_woken) callbacks
CROSS JOIN LATERAL (
    SELECT CASE WHEN c.running THEN pg_notify('slotd_control', json_build_object(
        'op', 'cancel', 'id', c.id, 'token', c.lease_token, 'by', %(by)s::text)::text)
        -- Not running: it has ended here (slotd.wait_result); a running one ends when its
        -- slot settles it (settle_cancelled).
        ELSE pg_notify('slotd_result', c.id::text) END
) n
ORDER BY c.id

-- name: cancelled_lease
-- The slot's own look, on a long attempt, for a cancel whose notification it never got.
SELECT t.last_error FROM slotd_tasks t
WHERE t.id = %(id)s AND t.lease_token = %(token)s::uuid AND t.cancelled_at IS NOT NULL

-- name: settle_cancelled
-- The end of an attempt an operator cancelled: the lease goes and the row stays the dead
-- letter the cancel made it, never retried unless someone runs `slotd dead retry`.
WITH settled AS (
    UPDATE slotd_tasks t
    SET lease_token = NULL, lease_expires_at = NULL
    WHERE t.id = %(id)s AND t.lease_token = %(token)s::uuid AND t.cancelled_at IS NOT NULL
    RETURNING t.id, t.batch_id, t.task_type, t.dead_attempts, t.last_attempted_at,
              t.last_error
), ended AS (
    SELECT s.id, s.batch_id, 'cancelled' AS outcome FROM settled s WHERE s.batch_id IS NOT NULL
), settled_attempt AS (
    SELECT s.id, s.task_type, coalesce(s.dead_attempts, 0) AS number,
           s.last_attempted_at AS started_at, s.last_error AS error
    FROM settled s
), {attempt_recorded}, {batch_counted}, seq_ended(id, sequence, halts) AS (
    SELECT s.id, m.sequence, false FROM settled s JOIN slotd_tasks m ON m.id = s.id
    WHERE m.sequence IS NOT NULL
), {sequence_moved}
SELECT s.id, pg_notify('slotd_result', s.id::text) FROM settled s
CROSS JOIN (SELECT count(*) FROM batch_woken) callbacks

-- name: expire
-- The expiry sweep (slotd/lifecycle/, "expired"): tasks past their expires_at that no lease
-- holds, soonest first through slotd_tasks_expiring, a batch per statement. Each becomes a
-- dead letter by the statement that decides it: dead_reason 'expired', the attempts it ran
-- kept in dead_attempts, attempt_count raised to the threshold (what makes it dead for
-- every reader and for 0.1.0 replicas, as a cancel does) so it leaves the discovery and
-- dedupe indexes. A running attempt has started: it is not expired, and a failure's retry
-- after expires_at is (no attempt starts after it). FOR UPDATE SKIP LOCKED: a claim taking
-- the row, or another replica's sweep, is passed over. As any terminal state does, in the
-- same statement: its dependants are cancelled (transitively, 'parent_failed', %(cause)s
-- naming it), and it and they are counted in their batches (expired / cancelled). Each
-- ended task's result notification (slotd.wait_result) goes out with the commit.
WITH RECURSIVE due AS (
    SELECT t.id FROM slotd_tasks t
    WHERE t.expires_at <= now() AND t.attempt_count < t.max_attempts
      AND NOT {lease_live}
    ORDER BY t.expires_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
), {expired_ended}

-- name: expire_key
-- An enqueue whose key is held by a task past its expires_at that the sweep has not reached
-- (with no replica running, none ever will): that task is ended here, as the sweep would
-- (expired_ended), in the enqueue's own transaction, and the enqueue inserts its own row.
-- Waits for a row another transaction holds (no SKIP LOCKED): the enqueue needs the key.
WITH RECURSIVE due AS (
    SELECT t.id FROM slotd_tasks t
    WHERE t.task_type = %(task_type)s AND t.key = %(key)s
      AND t.expires_at <= now() AND t.attempt_count < t.max_attempts
      AND NOT {lease_live}
    FOR UPDATE
), {expired_ended}

-- fragment: expired_ended
-- The end of each task in `due(id)` by its expiry: see `expire`.
expired AS (
    UPDATE slotd_tasks t
    SET dead_reason = 'expired',
        dead_attempts = t.attempt_count,
        attempt_count = greatest(t.attempt_count, t.max_attempts),
        lease_token = NULL,
        lease_expires_at = NULL,
        -- Where retention and the listing read when a dead letter stopped ({retired_at}):
        -- a task that never ran has no attempt, so its expiry stands in.
        last_attempted_at = coalesce(t.last_attempted_at, t.expires_at),
        last_error = format('expired at %%s %%s',
            to_char(t.expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
            CASE WHEN t.attempt_count = 0 THEN 'before it started'
                 ELSE format('after %%s attempt(s); last error: %%s', t.attempt_count,
                             coalesce(t.last_error, 'none')) END)
    FROM due
    WHERE t.id = due.id
    RETURNING t.id, t.task_type, t.has_dependants, t.batch_id
), doomed(id, root) AS (
    SELECT e.child_id, x.id FROM expired x JOIN slotd_dependencies e ON e.parent_id = x.id
    WHERE x.has_dependants
    UNION
    SELECT e.child_id, d.root FROM slotd_dependencies e JOIN doomed d ON e.parent_id = d.id
), {dependants_cancelled}, ended AS (
    SELECT x.id, x.batch_id, 'expired' AS outcome FROM expired x WHERE x.batch_id IS NOT NULL
    UNION ALL
    SELECT c.id, c.batch_id, 'cancelled' FROM cancelled c WHERE c.batch_id IS NOT NULL
), {batch_counted}, seq_ended(id, sequence, halts) AS (
    SELECT x.id, m.sequence, false FROM expired x JOIN slotd_tasks m ON m.id = x.id
    WHERE m.sequence IS NOT NULL
), {sequence_moved}
SELECT e.task_type, count(*) AS expired
FROM expired e
CROSS JOIN LATERAL (SELECT pg_notify('slotd_result', e.id::text)) n
CROSS JOIN (SELECT count(*) FROM told) cascaded
CROSS JOIN (SELECT count(*) FROM batch_woken) callbacks
GROUP BY e.task_type

-- name: lapsed
-- The lapse sweep (slotd/lifecycle/, "lapsed"): a final attempt whose lease ran out with
-- nobody left to settle it. A slot's death alone is settled by its supervisor at once
-- (handed_over); this is the whole replica gone (kill -9 of its process group, its host
-- lost). The row is already dead by {dead}; this writes the end its settlement would have:
-- the lease cleared, dead_reason 'exhausted' (a cancelled attempt keeps its cancel's), the
-- attempts it ran, an error saying what happened, and, as every terminal state does in the
-- same statement, its dependants cancelled (transitively, 'parent_failed', %(cause)s naming
-- it) and it and they counted in their batches, each ended task told on the result channel.
-- Without it, its dependants waited and its batch never called back until `slotd dead
-- retry`. Safe against a holder that is still alive: a slot retries a settlement only while
-- its lease lasts, so a lapsed lease is lost to it whatever happens next (its late write,
-- fenced on the token this clears, is `lost`). FOR UPDATE SKIP LOCKED: another replica's
-- sweep, or a settlement, holding the row is passed over. The leased rows are read through
-- slotd_tasks_leased_group, an index of the leases only: a handful of rows, whatever the
-- backlog.
WITH RECURSIVE due AS (
    SELECT t.id FROM slotd_tasks t
    WHERE t.lease_token IS NOT NULL AND t.attempt_count >= t.max_attempts
      AND t.lease_expires_at <= now()
    ORDER BY t.lease_expires_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
), lapsed AS (
    UPDATE slotd_tasks t
    SET lease_token = NULL,
        lease_expires_at = NULL,
        dead_reason = coalesce(t.dead_reason, 'exhausted'),
        dead_attempts = coalesce(t.dead_attempts, t.attempt_count),
        last_error = CASE WHEN t.cancelled_at IS NOT NULL THEN t.last_error
            ELSE format('its final attempt (%%s) was never settled: its lease lapsed at %%s '
                        'with no replica left holding it; last error: %%s', t.attempt_count,
                        to_char(t.lease_expires_at AT TIME ZONE 'UTC',
                                'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
                        coalesce(t.last_error, 'none')) END
    FROM due
    WHERE t.id = due.id
    RETURNING t.id, t.task_type, t.has_dependants, t.batch_id, t.dead_reason,
              t.dead_attempts, t.last_attempted_at, t.last_error
), lapse_recorded AS (
    -- Its attempt, remembered (sql/030): crashed (a cancelled one: cancelled), run by a
    -- worker nobody can name any more.
    INSERT INTO slotd_attempts (task_id, task_type, number, outcome, error, started_at)
    SELECT x.id, x.task_type, x.dead_attempts,
           CASE x.dead_reason WHEN 'cancelled' THEN 'cancelled' ELSE 'crashed' END,
           x.last_error, x.last_attempted_at
    FROM lapsed x
), doomed(id, root) AS (
    SELECT e.child_id, x.id FROM lapsed x JOIN slotd_dependencies e ON e.parent_id = x.id
    WHERE x.has_dependants AND x.dead_reason = 'exhausted'
    UNION
    SELECT e.child_id, d.root FROM slotd_dependencies e JOIN doomed d ON e.parent_id = d.id
), {dependants_cancelled}, ended AS (
    -- A cancelled running task's cancel left its end to its settlement (see `cancel`): this
    -- is that settlement.
    SELECT x.id, x.batch_id,
           CASE x.dead_reason WHEN 'exhausted' THEN 'failed' ELSE 'cancelled' END AS outcome
    FROM lapsed x WHERE x.batch_id IS NOT NULL
    UNION ALL
    SELECT c.id, c.batch_id, 'cancelled' FROM cancelled c WHERE c.batch_id IS NOT NULL
), {batch_counted}, seq_ended(id, sequence, halts) AS (
    -- A lapsed final attempt is a failure: its sequence halts, unless its handler goes on
    -- (%(go_on)s: the sweeping replica's types with sequence_on_failure="continue"; an
    -- operator's command passes none).
    SELECT x.id, m.sequence,
           x.dead_reason = 'exhausted' AND NOT x.task_type = ANY(%(go_on)s::text[])
    FROM lapsed x JOIN slotd_tasks m ON m.id = x.id
    WHERE m.sequence IS NOT NULL
), {sequence_moved}
SELECT x.task_type, x.dead_reason, count(*) AS lapsed
FROM lapsed x
CROSS JOIN LATERAL (SELECT pg_notify('slotd_result', x.id::text)) n
CROSS JOIN (SELECT count(*) FROM told) cascaded
CROSS JOIN (SELECT count(*) FROM batch_woken) callbacks
GROUP BY x.task_type, x.dead_reason

-- name: lapse_remembered
-- An attempt with attempts left whose lease lapsed (its replica died whole or froze), as
-- remembered by the claim that took the row over (slotd/lifecycle/, "lapsed"; fragment
-- `lapsed_lease`): crashed, run by a worker nobody can name any more, ended when its lease
-- lapsed. Fenced on the new lease, so only its holder writes it, once.
INSERT INTO slotd_attempts (task_id, task_type, number, outcome, error, started_at, ended_at)
SELECT t.id, t.task_type, t.attempt_count - 1, 'crashed',
       format('attempt %%s was never settled: its lease lapsed at %%s with no replica left '
              'holding it', t.attempt_count - 1,
              to_char(%(lapsed_at)s::timestamptz AT TIME ZONE 'UTC',
                      'YYYY-MM-DD"T"HH24:MI:SS"Z"')),
       %(started_at)s::timestamptz, %(lapsed_at)s::timestamptz
FROM slotd_tasks t
WHERE t.id = %(id)s AND t.lease_token = %(token)s::uuid

-- name: pause
-- Fleet-wide: the claim statement reads this table, so a pause needs no replica to hear of
-- it; the control notification is for their logs.
WITH paused AS (
    INSERT INTO slotd_paused_types AS p (task_type, until, paused_by)
    VALUES (%(task_type)s,
            coalesce(%(until)s::timestamptz, now() + make_interval(secs => %(for_s)s)),
            %(by)s)
    ON CONFLICT (task_type) DO UPDATE
    SET paused_at = now(), until = excluded.until, paused_by = excluded.paused_by
    RETURNING p.task_type, p.paused_at, p.until, p.paused_by
)
SELECT p.task_type, p.paused_at, p.until, p.paused_by
FROM paused p
CROSS JOIN LATERAL (
    SELECT pg_notify('slotd_control', json_build_object(
        'op', 'pause', 'task_type', p.task_type, 'until', p.until, 'by', p.paused_by)::text)
) n

-- name: resume
-- The row goes, and a wake goes out so the type's due work is claimed now, not at the next
-- tick. (A pause with an end resumes by itself at the first discovery after it.)
WITH gone AS (
    DELETE FROM slotd_paused_types p WHERE p.task_type = %(task_type)s
    RETURNING p.task_type, {pause_active} AS was_paused
)
SELECT g.was_paused
FROM gone g
CROSS JOIN LATERAL (
    SELECT pg_notify('slotd_control', json_build_object(
               'op', 'resume', 'task_type', g.task_type, 'by', %(by)s::text)::text),
           pg_notify('slotd_wake', '')
) n

-- name: paused_types
SELECT p.task_type, p.paused_at, p.until, p.paused_by,
       extract(epoch FROM p.until - now())::float8 AS remaining_s
FROM slotd_paused_types p
WHERE {pause_active}
ORDER BY p.task_type

-- Dashboard reads (slotd.web). Each is bounded: counts stop at a cap, lists at a limit, so
-- a page costs the same on a million dead letters as on ten.

-- name: dash_types
-- Every type with rows or a replica serving it: a loose index scan (one index probe per
-- type) over the per-type live index and the dead-letter index, never a read of the rows.
WITH RECURSIVE live AS (
    (SELECT t.task_type, 1 AS n FROM slotd_tasks t WHERE {retryable}
     ORDER BY t.task_type LIMIT 1)
    UNION ALL
    SELECT (SELECT t.task_type FROM slotd_tasks t
            WHERE {retryable} AND t.task_type > l.task_type
            ORDER BY t.task_type LIMIT 1), l.n + 1
    FROM live l WHERE l.task_type IS NOT NULL AND l.n < %(limit)s
), exhausted AS (
    (SELECT t.task_type, 1 AS n FROM slotd_tasks t WHERE t.attempt_count >= t.max_attempts
     ORDER BY t.task_type LIMIT 1)
    UNION ALL
    SELECT (SELECT t.task_type FROM slotd_tasks t
            WHERE t.attempt_count >= t.max_attempts AND t.task_type > e.task_type
            ORDER BY t.task_type LIMIT 1), e.n + 1
    FROM exhausted e WHERE e.task_type IS NOT NULL AND e.n < %(limit)s
)
SELECT DISTINCT x.task_type FROM (
    SELECT task_type FROM live
    UNION ALL SELECT task_type FROM exhausted
    UNION ALL SELECT unnest(r.task_types) FROM slotd_replicas r
    WHERE r.seen_at >= now() - interval '1 minute'
) x
WHERE x.task_type IS NOT NULL
ORDER BY x.task_type
LIMIT %(limit)s

-- name: dash_counts
-- Per type: the gauges' pending / running / dead (the same predicates), each count
-- stopping at the cap, and the oldest due from the per-type index.
SELECT ty.task_type,
       (SELECT count(*) FROM (SELECT 1 FROM slotd_tasks t
                              WHERE t.task_type = ty.task_type AND {retryable}
                              LIMIT %(cap)s) c)
       + (SELECT count(*) FROM slotd_tasks t
          WHERE t.task_type = ty.task_type AND {final_running}) AS pending,
       (SELECT count(*) FROM (SELECT 1 FROM slotd_tasks t
                              WHERE t.task_type = ty.task_type AND {running}
                              LIMIT %(cap)s) c) AS running,
       (SELECT count(*) FROM (SELECT 1 FROM slotd_tasks t
                              WHERE t.task_type = ty.task_type AND {dead}
                              LIMIT %(cap)s) c) AS dead,
       (SELECT extract(epoch FROM now() - t.run_at)::float8 FROM slotd_tasks t
        WHERE t.task_type = ty.task_type AND {claimable}
        ORDER BY t.run_at LIMIT 1) AS oldest_due_s,
       -- A paused type's backlog waits too, on purpose: its wait, pause or not.
       (SELECT extract(epoch FROM now() - t.run_at)::float8 FROM slotd_tasks t
        WHERE t.task_type = ty.task_type AND t.run_at <= now() AND {retryable}
          AND NOT {lease_live}
        ORDER BY t.run_at LIMIT 1) AS oldest_waiting_s
FROM unnest(%(types)s::text[]) AS ty(task_type)
ORDER BY ty.task_type

-- name: rate_windows_prune
-- The retention chore: windows whose last start left the window a minute ago or more (a
-- group seen once, a type no longer started) go, with their starts, a batch at a time. A
-- claim racing the delete either updated the window first (the delete re-checks the row
-- it waited for and keeps it) or finds it gone and starts the window again at seq 1: the
-- deleted starts were all outside any window, so "none" is what they said anyway.
WITH gone AS (
    DELETE FROM slotd_rate_windows w
    WHERE (w.task_type, w.per_group, w.task_group) IN (
        SELECT x.task_type, x.per_group, x.task_group FROM slotd_rate_windows x
        WHERE x.last_start_at < now() - make_interval(secs => x.window_s) - interval '1 minute'
        LIMIT %(batch)s)
      AND w.last_start_at < now() - make_interval(secs => w.window_s) - interval '1 minute'
    RETURNING w.task_type, w.per_group, w.task_group
), starts_gone AS (
    DELETE FROM slotd_rate_starts rs
    USING gone g
    WHERE rs.task_type = g.task_type AND rs.per_group = g.per_group
      AND rs.task_group = g.task_group
)
SELECT count(*) FROM gone

-- name: dash_rates
{rate_rows}

-- name: dash_outcomes
-- Attempts by bucket (%(unit)s: minute or hour), type and outcome over the last
-- %(buckets)s buckets, the current one included: the charts' last hour by minute and last
-- day by hour (slotd_outcomes keeps 25 hours). One type, or all with NULL. A range of the
-- primary key, which leads with the minute: at most minutes x types x outcomes rows.
SELECT date_trunc(%(unit)s, o.minute) AS minute, o.task_type, o.outcome,
       sum(o.count)::bigint AS count
FROM slotd_outcomes o
WHERE o.minute >= date_trunc(%(unit)s, now())
                  - (%(buckets)s - 1) * ('1 ' || %(unit)s)::interval
  AND (%(task_type)s::text IS NULL OR o.task_type = %(task_type)s)
GROUP BY 1, o.task_type, o.outcome
ORDER BY 1, o.task_type, o.outcome

-- name: record_outcomes
-- A supervisor's tally since its last heartbeat; minutes older than 25 hours go in the
-- same statement (the primary key leads with the minute, so the prune is an index range).
-- Kept 25 hours: the dashboard's last day by hour (at most 1,500 minutes x types x outcomes).
WITH pruned AS (
    DELETE FROM slotd_outcomes WHERE minute < now() - interval '25 hours'
)
INSERT INTO slotd_outcomes AS o (minute, task_type, outcome, count)
SELECT * FROM unnest(%(minutes)s::timestamptz[], %(types)s::text[], %(outcomes)s::text[],
                     %(counts)s::bigint[])
ON CONFLICT (minute, task_type, outcome) DO UPDATE SET count = o.count + excluded.count

-- name: dash_running
-- Every row under a lease (a live one, or one whose holder vanished and which the next
-- claim will take over), with its deadline and, once its replica has heartbeated since the
-- claim, the replica and slot holding it.
SELECT t.id, t.task_type, {task_key} AS key, {attempts_made} AS attempt_count, t.max_attempts,
       t.last_attempted_at AS started_at, t.lease_expires_at,
       t.lease_expires_at - make_interval(secs => %(margin_s)s) AS deadline,
       {lease_live} AS lease_live, now() AS db_now, t.cancelled_at IS NOT NULL AS cancelled,
       h.hostname, h.pid, h.slot
FROM slotd_tasks t
LEFT JOIN LATERAL (
    SELECT r.hostname, r.pid, (r.leases ->> t.id::text)::int AS slot
    FROM slotd_replicas r WHERE r.leases ? t.id::text
    ORDER BY r.seen_at DESC LIMIT 1
) h ON true
WHERE t.lease_token IS NOT NULL
ORDER BY t.lease_expires_at, t.id
LIMIT %(limit)s

-- name: dash_task
-- One task, with the replica and slot holding its lease as its replica last said; its
-- state ({task_state}), what it waits for (sql/072), how many steps it stored (sql/070:
-- the page reads them a page at a time, dash_steps), when it ended (a dead letter: when it
-- stopped) and when its first remembered attempt started (sql/030's index, one entry); its
-- sequence, place, whether it waits its turn, and who halted the sequence (sql/080).
SELECT t.id, t.task_type, {task_key} AS key, t.payload, {shown_run_at},
       {attempts_made} AS attempt_count, t.max_attempts, t.lease_token IS NOT NULL AS leased,
       t.lease_expires_at, t.last_error, t.last_attempted_at, t.created_at, now() AS db_now,
       t.cancelled_at, {dead_reason} AS dead_reason, {dead} AS dead, {running} AS running,
       {claimable} AS due, h.hostname, h.pid, h.slot, t.batch_id, t.parents_left,
       {task_state} AS task_state, t.wait_step, t.wait_event, t.wait_until, t.expires_at,
       t.snoozes, coalesce(jsonb_array_length(t.steps), 0) AS step_count,
       CASE WHEN {dead} THEN {retired_at} END AS ended_at,
       (SELECT a.started_at FROM slotd_attempts a WHERE a.task_id = t.id
        ORDER BY a.id LIMIT 1) AS first_started_at,
       t.sequence, t.sequence_pos, t.sequence_waiting,
       (SELECT q.halted_by FROM slotd_sequences q WHERE q.name = t.sequence) AS sequence_halted_by
FROM slotd_tasks t
LEFT JOIN LATERAL (
    SELECT r.hostname, r.pid, (r.leases ->> t.id::text)::int AS slot
    FROM slotd_replicas r WHERE t.lease_token IS NOT NULL AND r.leases ? t.id::text
    ORDER BY r.seen_at DESC LIMIT 1
) h ON true
WHERE t.id = %(id)s

-- name: dash_dead_count
-- How many dead letters match, up to the cap: the page says "10000+" past it.
SELECT count(*) FROM (
    SELECT 1 FROM slotd_tasks t
    WHERE {dead} AND (%(task_type)s::text IS NULL OR t.task_type = %(task_type)s)
    LIMIT %(cap)s
) c

-- name: dash_tables
-- Which optional tables (schedules, pauses) this database has: the dashboard shows the
-- capabilities that have landed without knowing their release.
SELECT n FROM unnest(%(names)s::text[]) AS n WHERE to_regclass(n) IS NOT NULL

-- name: dash_bound
-- The first statement of each dashboard transaction: none of its statements runs long or
-- waits long for a lock, whatever a page asks. Local to the transaction (never the
-- session's): behind a transaction-mode pooler a session setting would stay on the server
-- connection for the pool's other clients.
SELECT set_config('statement_timeout', %(statement_timeout)s, true),
       set_config('lock_timeout', %(lock_timeout)s, true)

-- name: dash_schedules
-- Whatever columns the schedules table has (read only once dash_tables found it).
SELECT to_jsonb(s) FROM slotd_schedules s ORDER BY 1 LIMIT %(limit)s

-- name: result_of
-- A task's state for slotd.result ({task_state}): its queue row while it has one, with the
-- last error of a failed or retrying one and the reason of a cancelled or expired one, else
-- its stored result until keep_result runs out.
SELECT {task_state} AS state,
       NULL::jsonb AS value,
       CASE WHEN {dead} OR t.run_at > now() THEN t.last_error
            WHEN NOT {unexpired} AND NOT {lease_live}
            THEN format('expired at %%s before it started',
                        to_char(t.expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'))
       END AS error
FROM slotd_tasks t WHERE t.id = %(id)s
UNION ALL
SELECT 'succeeded', r.value, NULL
FROM slotd_results r WHERE r.task_id = %(id)s AND r.expires_at > now()
LIMIT 1

-- name: state_counts
-- `slotd status`: each type's rows by state ({task_state}), every row in exactly one state,
-- so the columns add up. A read of every row: an operator's command, never a scrape (the
-- gauges keep their own partial-index reads and their meaning).
SELECT t.task_type, {task_state} AS state, count(*)::bigint AS n
FROM slotd_tasks t
GROUP BY 1, 2

-- name: attempts_of
-- A task's attempts, oldest first (slotd.result(...).attempts): those remembered
-- (slotd_attempts, sql/030), then the one running now, read from its row and, once its
-- replica has heartbeated since the claim, the replica and slot holding it.
SELECT x.number, x.outcome, x.error, x.started_at, x.ended_at, x.host, x.pid, x.slot
FROM (
    SELECT 0 AS k, a.id, a.number, a.outcome, a.error, a.started_at, a.ended_at, a.host,
           a.pid, a.slot
    FROM slotd_attempts a WHERE a.task_id = %(id)s
    UNION ALL
    SELECT 1, t.id, t.attempt_count, NULL, NULL, t.last_attempted_at, NULL, h.hostname,
           h.pid, h.slot
    FROM slotd_tasks t
    LEFT JOIN LATERAL (
        SELECT r.hostname, r.pid, (r.leases ->> t.id::text)::int AS slot
        FROM slotd_replicas r WHERE r.leases ? t.id::text
        ORDER BY r.seen_at DESC LIMIT 1
    ) h ON true
    WHERE t.id = %(id)s AND t.lease_token IS NOT NULL AND {lease_live}
) x
ORDER BY x.k, x.id

-- name: attempts_prune
-- The retention chore: the attempts of tasks no longer answerable (no row, no stored
-- result or history, no Django result: get_result reads them), a batch per transaction.
DELETE FROM slotd_attempts a
WHERE a.id IN (
    SELECT x.id FROM slotd_attempts x
    WHERE NOT EXISTS (SELECT FROM slotd_tasks t WHERE t.id = x.task_id)
      AND NOT EXISTS (SELECT FROM slotd_results r WHERE r.task_id = x.task_id)
      AND NOT EXISTS (SELECT FROM slotd_django_results d WHERE d.task_id = x.task_id)
    LIMIT %(batch)s
)

-- name: results_prune
-- The retention chore: results past their keep_result, a batch per transaction.
DELETE FROM slotd_results r
WHERE r.task_id IN (
    SELECT x.task_id FROM slotd_results x WHERE x.expires_at <= now()
    ORDER BY x.expires_at LIMIT %(batch)s
)

-- name: listen_results
LISTEN slotd_result

-- name: unlisten_results
UNLISTEN slotd_result

-- fragment: failed_linked
-- failed_plain for a task with dependants, of a batch or of a sequence: the attempt that
-- makes it a dead letter also cancels its dependants, and theirs (transitively), in the same
-- statement, with a reason naming it (%(cause)s), counts every task that ended so in its
-- batch, and moves its sequence on or halts it. No cycle can exist: a task's parents exist
-- before it does. RECURSIVE: the composer writes WITH RECURSIVE for a part that begins
-- with it.
RECURSIVE backoff AS (
    {failure_backoff}
), {failure_written}, doomed(id, root) AS (
    SELECT e.child_id, f.id FROM slotd_dependencies e, failed f
    WHERE e.parent_id = f.id AND f.attempt_count >= f.max_attempts
    UNION
    SELECT e.child_id, d.root FROM slotd_dependencies e JOIN doomed d ON e.parent_id = d.id
), {dependants_cancelled}, ended AS (
    SELECT f.id, f.batch_id, CASE f.dead_reason WHEN 'exhausted' THEN 'failed'
                WHEN 'discarded' THEN 'failed' WHEN 'expired' THEN 'expired'
                ELSE 'cancelled' END AS outcome
    FROM failed f WHERE f.batch_id IS NOT NULL AND f.attempt_count >= f.max_attempts
    UNION ALL
    SELECT c.id, c.batch_id, 'cancelled' FROM cancelled c WHERE c.batch_id IS NOT NULL
), {batch_counted}, seq_ended(id, sequence, halts) AS (
    -- A sequence's member that ended failed halts it unless its handler goes on (sql/080);
    -- one with attempts left still holds it.
    SELECT f.id, m.sequence,
           f.dead_reason IN ('exhausted', 'discarded') AND NOT %(sequence_go_on)s::bool
    FROM failed f JOIN slotd_tasks m ON m.id = f.id
    WHERE f.attempt_count >= f.max_attempts AND m.sequence IS NOT NULL
), {sequence_moved}

-- fragment: failed_linked_told
(SELECT count(*) FROM told) cascaded, (SELECT count(*) FROM batch_woken) callbacks

-- fragment: dependants_cancelled
-- The dependants in `doomed`, cancelled as an operator's cancel would (a dead letter that
-- no claim can take), each told on the result channel, with dead_reason 'parent_failed'
-- (sql/021: a parent, or an ancestor, failed, was cancelled or expired; the text says
-- which) and the attempts they really ran. %(cause)s: a format() text whose
-- %s is the ended task it waited on, directly or through its parents (`root`).
cancelled AS (
    UPDATE slotd_tasks t
    SET attempt_count = greatest(t.attempt_count, t.max_attempts),
        dead_reason = 'parent_failed',
        dead_attempts = t.attempt_count,
        cancelled_at = now(),
        last_error = format(%(cause)s::text, d.root)
    FROM (SELECT DISTINCT ON (x.id) x.id, x.root FROM doomed x ORDER BY x.id, x.root) d
    WHERE t.id = d.id AND {live}
    RETURNING t.id, t.batch_id
), told AS (
    SELECT c.id, pg_notify('slotd_result', c.id::text) FROM cancelled c
)

-- name: cancel_dependants
-- The dependants of tasks an operator cancelled (slotd.cancel), transitively, in the
-- cancel's own transaction, each counted in its batch.
WITH RECURSIVE doomed(id, root) AS (
    SELECT e.child_id, e.parent_id FROM slotd_dependencies e
    WHERE e.parent_id = ANY(%(ids)s::bigint[])
    UNION
    SELECT e.child_id, d.root FROM slotd_dependencies e JOIN doomed d ON e.parent_id = d.id
), {dependants_cancelled}, ended AS (
    SELECT c.id, c.batch_id, 'cancelled' AS outcome FROM cancelled c
    WHERE c.batch_id IS NOT NULL
), {batch_counted}
SELECT (SELECT count(*) FROM told), (SELECT count(*) FROM batch_woken)

-- fragment: settled_linked
-- The success of a task with dependants or of a batch: the delete (fenced), its result
-- where its type keeps one (keep_s not NULL), its value on every edge to a dependant, each
-- dependant whose last parent this was made due now (run_at from 'infinity'; its
-- priority's head start kept: order_at = now() - priority x step), and its end counted in
-- its batch (which may enqueue the batch's callback). Its _told part sends the wakes.
done AS (
    DELETE FROM slotd_tasks t
    WHERE t.id = %(id)s AND t.lease_token IS NOT DISTINCT FROM %(done_token)s::uuid
    RETURNING t.id, t.task_type, t.batch_id, t.attempt_count AS number,
              t.last_attempted_at AS started_at, {task_key} AS key, t.tags
), kept AS (
    INSERT INTO slotd_results (task_id, task_type, value, expires_at, key, tags)
    SELECT d.id, d.task_type, %(kept_value)s::jsonb,
           now() + make_interval(secs => %(keep_s)s), d.key, d.tags
    FROM done d WHERE %(keep_s)s::float8 IS NOT NULL
    RETURNING task_id
), settled_attempt AS (
    SELECT d.id, d.task_type, d.number, d.started_at, NULL::text AS error
    FROM done d WHERE %(keep_s)s::float8 IS NOT NULL
), {attempt_recorded}, edges AS (
    UPDATE slotd_dependencies e SET parent_done = true, value = %(value)s::jsonb
    FROM done d WHERE e.parent_id = d.id AND NOT e.parent_done
    RETURNING e.child_id
), released AS (
    UPDATE slotd_tasks t
    SET parents_left = t.parents_left - 1,
        run_at = CASE WHEN t.parents_left <= 1 THEN now() ELSE t.run_at END,
        order_at = CASE WHEN t.parents_left <= 1
                        THEN now() - make_interval(secs => t.priority * %(step_s)s)
                        ELSE t.order_at END
    FROM edges e
    WHERE t.id = e.child_id AND t.parents_left > 0
    RETURNING t.id, t.parents_left
), ended AS (
    SELECT d.id, d.batch_id, 'succeeded' AS outcome FROM done d WHERE d.batch_id IS NOT NULL
), {batch_counted}, seq_ended(id, sequence, halts) AS (
    SELECT d.id, m.sequence, false FROM done d JOIN slotd_tasks m ON m.id = d.id
    WHERE m.sequence IS NOT NULL
), {sequence_moved}

-- fragment: settled_linked_told
-- The linked success's notifications: one wake for the dependants it made due, the result
-- notification of a kept result, the batch callback's wake (see batch_counted).
(SELECT count(*) FROM (SELECT pg_notify('slotd_wake', '') FROM released r
                       WHERE r.parents_left = 0 LIMIT 1) w) wake,
(SELECT count(*) FROM (SELECT pg_notify('slotd_result', k.task_id::text)
                       FROM kept k) k) told,
(SELECT count(*) FROM batch_woken) callbacks

-- fragment: settled_member
-- The success of a batch's member with no dependants and no kept result, the commonest
-- linked settlement: the fenced delete and its end counted on its stripe (batch_counted),
-- nothing else. settled_linked also names slotd_results and slotd_dependencies, and every
-- table and index a statement names is locked and opened on each execution whether or not
-- a row of it is touched: a batch drained at 0.7x the plain rate through it
-- (tests/bench/workflows.py). It refuses a row that gained dependants since its claim
-- (has_dependants): that success is settled by settled_linked instead (repository).
done AS (
    DELETE FROM slotd_tasks t
    WHERE t.id = %(id)s AND t.lease_token IS NOT DISTINCT FROM %(done_token)s::uuid
      AND NOT t.has_dependants
    RETURNING t.id, t.task_type, t.batch_id
), ended AS (
    SELECT d.id, d.batch_id, 'succeeded' AS outcome FROM done d WHERE d.batch_id IS NOT NULL
), {batch_counted}

-- fragment: settled_member_told
(SELECT count(*) FROM batch_woken) callbacks

-- name: depend_parents
-- A dependant's enqueue, first: its parents marked (has_dependants, so their settlement
-- takes the parent's statements) and locked to the enqueue's commit, so none settles
-- unseen meanwhile. Only live parents count; the caller refuses the rest.
UPDATE slotd_tasks t SET has_dependants = true
WHERE t.id = ANY(%(parents)s::bigint[]) AND {live}
RETURNING t.id

-- name: depend_children
-- Then, after the dependants' own insert: each made to wait (run_at = order_at = infinity:
-- not due, behind every discovery window) on its parents, with an edge per pair.
WITH children AS (
    UPDATE slotd_tasks t
    SET run_at = 'infinity', order_at = 'infinity',
        parents_left = cardinality(%(parents)s::bigint[])
    WHERE t.id = ANY(%(children)s::bigint[])
    RETURNING t.id
)
INSERT INTO slotd_dependencies (parent_id, child_id)
SELECT p.id, c.id FROM unnest(%(parents)s::bigint[]) AS p(id) CROSS JOIN children c

-- name: dependencies_prune
-- The retention chore: edges whose dependant is gone (settled, or its dead letter pruned).
DELETE FROM slotd_dependencies e
WHERE (e.parent_id, e.child_id) IN (
    SELECT x.parent_id, x.child_id FROM slotd_dependencies x
    WHERE NOT EXISTS (SELECT FROM slotd_tasks t WHERE t.id = x.child_id)
    LIMIT %(batch)s
)

-- name: dependency_edges
-- A task's parents and dependants, for the dashboard's task page.
SELECT 'parent' AS side, e.parent_id AS id, e.parent_done AS done FROM slotd_dependencies e
WHERE e.child_id = %(id)s
UNION ALL
SELECT 'dependant', e.child_id, e.parent_done FROM slotd_dependencies e
WHERE e.parent_id = %(id)s

-- fragment: batch_counted
-- The ends of a batch's tasks, from the statement's `ended(id, batch_id, outcome)` (outcome
-- succeeded / failed / cancelled / expired): counted on each task's stripe (id modulo 16,
-- sql/020), never by a count over the batch. A stripe whose last task this was moves its
-- counts to the batch and takes one off stripes_left, once the batch is sealed (its block
-- ended; before that only the enqueueing transaction sees its tasks, and the seal counts
-- the stripes already done). The statement that takes the last one off enqueues the
-- callback, payload + {"batch": counts}, with one wake: exactly once, in the transaction
-- that settled the batch's last task. The batch row's lock orders those statements; its
-- counts are the row's own (re-read under the lock), never another statement's snapshot.
stripe_counts AS (
    UPDATE slotd_batch_stripes s
    SET remaining = s.remaining - e.n,
        succeeded = s.succeeded + e.succeeded, failed = s.failed + e.failed,
        cancelled = s.cancelled + e.cancelled, expired = s.expired + e.expired
    FROM (SELECT x.batch_id, (x.id %% 16)::smallint AS stripe, count(*)::int AS n,
                 count(*) FILTER (WHERE x.outcome = 'succeeded')::int AS succeeded,
                 count(*) FILTER (WHERE x.outcome = 'failed')::int AS failed,
                 count(*) FILTER (WHERE x.outcome = 'cancelled')::int AS cancelled,
                 count(*) FILTER (WHERE x.outcome = 'expired')::int AS expired
          FROM ended x WHERE x.batch_id IS NOT NULL
          GROUP BY x.batch_id, (x.id %% 16)::smallint) e
    WHERE s.batch_id = e.batch_id AND s.stripe = e.stripe
    RETURNING s.batch_id, s.remaining, s.succeeded, s.failed, s.cancelled, s.expired
), batch_counts AS (
    UPDATE slotd_batches b
    SET stripes_left = b.stripes_left - f.n,
        succeeded = b.succeeded + f.succeeded, failed = b.failed + f.failed,
        cancelled = b.cancelled + f.cancelled, expired = b.expired + f.expired,
        completed_at = CASE WHEN b.stripes_left = f.n THEN now() END,
        callback_id = CASE WHEN b.stripes_left = f.n
                           THEN nextval(pg_get_serial_sequence('slotd_tasks', 'id')) END
    FROM (SELECT c.batch_id, count(*)::int AS n, sum(c.succeeded)::int AS succeeded,
                 sum(c.failed)::int AS failed, sum(c.cancelled)::int AS cancelled,
                 sum(c.expired)::int AS expired
          FROM stripe_counts c WHERE c.remaining = 0 GROUP BY c.batch_id) f
    WHERE b.id = f.batch_id AND b.stripes_left IS NOT NULL
    RETURNING b.*
), {batch_callback}

-- fragment: batch_callback
-- A completed batch's callback (from `batch_counts`, or the seal of a batch with nothing
-- left to wait for): an ordinary task, due now, under the batch's attempt threshold.
batch_callbacks AS (
    INSERT INTO slotd_tasks (id, task_type, payload, run_at, order_at, max_attempts,
                             max_attempts_explicit)
    SELECT c.callback_id, c.callback_type,
           c.callback_payload || jsonb_build_object('batch', jsonb_build_object(
               'id', c.id, 'succeeded', c.succeeded, 'failed', c.failed,
               'cancelled', c.cancelled, 'expired', c.expired)),
           now(), now(), c.max_attempts, c.max_attempts_explicit
    FROM batch_counts c WHERE c.callback_id IS NOT NULL
    RETURNING id
), batch_woken AS (
    SELECT pg_notify('slotd_wake', '') FROM (SELECT 1 FROM batch_callbacks LIMIT 1) w
)

-- name: batch_open
-- slotd.batch's block starts: the batch row, in the caller's transaction.
INSERT INTO slotd_batches (callback_type, callback_payload, max_attempts,
                           max_attempts_explicit)
VALUES (%(task_type)s, %(payload)s::jsonb, %(max_attempts)s, %(explicit)s)
RETURNING id

-- name: batch_join
-- Tasks just inserted by the batch's block join it: each counted on its stripe, the batch's
-- total raised. Nobody else sees them before the block's transaction commits.
WITH joined AS (
    UPDATE slotd_tasks t SET batch_id = %(batch)s
    WHERE t.id = ANY(%(ids)s::bigint[]) AND t.batch_id IS NULL
    RETURNING t.id
), stripes AS (
    INSERT INTO slotd_batch_stripes AS s (batch_id, stripe, remaining)
    SELECT %(batch)s, (j.id %% 16)::smallint, count(*) FROM joined j
    GROUP BY (j.id %% 16)::smallint
    ON CONFLICT (batch_id, stripe) DO UPDATE SET remaining = s.remaining + excluded.remaining
)
UPDATE slotd_batches b SET total = b.total + (SELECT count(*) FROM joined)
WHERE b.id = %(batch)s
RETURNING b.total

-- name: batch_seal
-- The block ended: from now on a stripe that empties counts towards the batch's end. The
-- stripes already empty (tasks the test modes ran inside the block) are counted here; a
-- batch with nothing left (empty, or all ended already) enqueues its callback now.
WITH batch_counts AS (
    UPDATE slotd_batches b
    SET stripes_left = f.left_n, sealed_at = now(),
        succeeded = f.succeeded, failed = f.failed, cancelled = f.cancelled, expired = f.expired,
        completed_at = CASE WHEN f.left_n = 0 THEN now() END,
        callback_id = CASE WHEN f.left_n = 0
                           THEN nextval(pg_get_serial_sequence('slotd_tasks', 'id')) END
    FROM (SELECT count(*) FILTER (WHERE s.remaining > 0)::int AS left_n,
                 coalesce(sum(s.succeeded) FILTER (WHERE s.remaining = 0), 0)::int AS succeeded,
                 coalesce(sum(s.failed) FILTER (WHERE s.remaining = 0), 0)::int AS failed,
                 coalesce(sum(s.cancelled) FILTER (WHERE s.remaining = 0), 0)::int AS cancelled,
                 coalesce(sum(s.expired) FILTER (WHERE s.remaining = 0), 0)::int AS expired
          FROM slotd_batch_stripes s WHERE s.batch_id = %(batch)s) f
    WHERE b.id = %(batch)s AND b.stripes_left IS NULL
    RETURNING b.*
), {batch_callback}
SELECT c.total, c.callback_id FROM batch_counts c
CROSS JOIN (SELECT count(*) FROM batch_woken) callbacks

-- name: batches_in_flight
-- slotd status and the dashboard: sealed batches not yet complete, with how many of their
-- tasks ended (at most 16 stripe rows each).
SELECT b.id, b.callback_type, b.total,
       (SELECT coalesce(sum(s.succeeded + s.failed + s.cancelled + s.expired), 0)::int
        FROM slotd_batch_stripes s WHERE s.batch_id = b.id) AS done,
       extract(epoch FROM now() - b.created_at)::float8 AS age_s
FROM slotd_batches b
WHERE b.completed_at IS NULL AND b.stripes_left IS NOT NULL
ORDER BY b.id
LIMIT %(limit)s

-- name: batch_of
-- One batch: its counts while in flight (from its stripes) and once complete.
SELECT b.id, b.callback_type, b.total,
       (SELECT coalesce(sum(s.succeeded + s.failed + s.cancelled + s.expired), 0)::int
        FROM slotd_batch_stripes s WHERE s.batch_id = b.id) AS done,
       b.succeeded, b.failed, b.cancelled, b.expired, b.callback_id, b.created_at,
       b.completed_at
FROM slotd_batches b WHERE b.id = %(id)s

-- name: batches_prune
-- The retention chore: batches completed longer ago than the retention, with their stripes.
WITH gone AS (
    DELETE FROM slotd_batches b
    WHERE b.id IN (SELECT x.id FROM slotd_batches x
                   WHERE x.completed_at < now() - make_interval(secs => %(older_than_s)s)
                   ORDER BY x.completed_at LIMIT %(batch)s)
    RETURNING b.id
), stripes AS (
    DELETE FROM slotd_batch_stripes s USING gone g WHERE s.batch_id = g.id
)
SELECT count(*) FROM gone
