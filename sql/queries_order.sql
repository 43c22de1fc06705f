-- Who runs next (#39): sequences, and the statements beside them. The claim and the
-- settlements in queries.sql splice the fragments here; every statement aliases
-- slotd_tasks as t.
--
-- Shared limits (within_shared, shared_open, within_shared_rates, shared_rate_starts) are
-- spliced only into each statement's `<name>_shared` twin (slotd/repository/named.py), which
-- the repository runs for a registry that declares a shared limit: every table and index a
-- statement names is opened on each execution whether or not a row of it is read, and the
-- plain claim with them drained 20% slower (tests/bench/RESULTS.md). Under the plain name
-- they are spliced as nothing.

-- predicate: sequence_holding
-- A member that holds its sequence: it has not ended (attempts left and not past its
-- expiry), or an attempt of it still runs (a cancelled one too, until its slot settles it).
-- The sequence's head is its holding member with the lowest place (sql/080).
((t.attempt_count < t.max_attempts AND {unexpired}) OR {lease_live})

-- name: sequence_enter
-- An enqueue into sequences, first (slotd/producer/sequences.py): each sequence's row taken
-- (an upsert: the row lock is held to the enqueuer's commit) and `counts` places drawn from
-- it, in name order so two enqueuers never wait on each other in a cycle. A second enqueuer
-- of a sequence waits here for the first one's commit, so places are drawn in commit order
-- (sql/080). Returns each sequence's last place drawn and whether it is halted.
INSERT INTO slotd_sequences AS s (name, last_pos)
SELECT n.name, n.count
FROM unnest(%(names)s::text[], %(counts)s::bigint[]) AS n(name, count)
ORDER BY n.name
ON CONFLICT (name) DO UPDATE
SET last_pos = s.last_pos + excluded.last_pos, updated_at = now()
RETURNING s.name, s.last_pos, s.halted_by IS NOT NULL AS halted

-- name: sequence_join
-- Then, after the rows' own insert, in a new statement (its snapshot taken after the lock
-- wait of sequence_enter: it sees every member committed before): each new member placed.
-- It waits (sequence_waiting; run_at = order_at = 'infinity', as a dependant waits: never
-- claimable, behind every discovery window) when its sequence is halted, when a member of
-- the sequence still holds it, or behind an earlier member of the same enqueue. Marked
-- has_dependants, so every settlement of it takes the linked statements, which move the
-- sequence on (fragment sequence_moved).
-- Per sequence once, not per row: the new rows are not in their sequence yet (this places
-- them), so any member found holding it is an earlier one.
WITH input AS (
    SELECT i.id, i.name, i.pos, min(i.pos) OVER (PARTITION BY i.name) AS first_pos
    FROM unnest(%(ids)s::bigint[], %(names)s::text[], %(positions)s::bigint[])
         AS i(id, name, pos)
), held AS (
    SELECT n.name,
           (s.halted_by IS NOT NULL
            OR EXISTS (SELECT 1 FROM slotd_tasks t
                       WHERE t.sequence = n.name AND {sequence_holding})) AS held
    FROM (SELECT DISTINCT i.name FROM input i) n
    JOIN slotd_sequences s ON s.name = n.name
), placed AS (
    SELECT i.id, i.name, i.pos, h.held OR i.pos > i.first_pos AS waits
    FROM input i JOIN held h ON h.name = i.name
)
UPDATE slotd_tasks t
SET sequence = p.name, sequence_pos = p.pos, has_dependants = true,
    sequence_waiting = p.waits,
    run_at = CASE WHEN p.waits THEN 'infinity' ELSE t.run_at END,
    order_at = CASE WHEN p.waits THEN 'infinity' ELSE t.order_at END
FROM placed p
WHERE t.id = p.id
RETURNING t.id, t.sequence_waiting

-- name: sequence_lock_task
-- Before a settlement that may end a member of a sequence, in its own statement of the same
-- transaction: the sequence's row lock, so the settlement's snapshot sees every member whose
-- enqueue committed before it (an enqueue that saw this task holding commits first, and its
-- member is released by the settlement; one that comes after sees the task ended). No row
-- for a task outside any sequence: one primary-key look.
SELECT s.name FROM slotd_sequences s
WHERE s.name = (SELECT t.sequence FROM slotd_tasks t WHERE t.id = %(id)s)
FOR UPDATE OF s

-- name: sequence_lock_expiring
-- Before the expiry sweep (`expire`): the rows of the sequences it may end a member of.
SELECT s.name FROM slotd_sequences s
WHERE s.name IN (SELECT t.sequence FROM slotd_tasks t
                 WHERE t.expires_at <= now() AND t.attempt_count < t.max_attempts
                   AND NOT {lease_live} AND t.sequence IS NOT NULL)
ORDER BY s.name
FOR UPDATE OF s

-- name: sequence_lock_key
-- Before `expire_key` (an enqueue ending the expired task that holds its key): the row of
-- the sequence it may end a member of, so that end sees every member whose enqueue
-- committed first, as the sweep's does (an enqueue into the sequence holds this lock to its
-- commit; without it a member enqueued meanwhile was left waiting behind an ended head).
SELECT s.name FROM slotd_sequences s
WHERE s.name IN (SELECT t.sequence FROM slotd_tasks t
                 WHERE t.task_type = %(task_type)s AND t.key = %(key)s
                   AND t.expires_at <= now() AND t.attempt_count < t.max_attempts
                   AND NOT {lease_live} AND t.sequence IS NOT NULL)
ORDER BY s.name
FOR UPDATE OF s

-- name: sequence_lock_lapsed
-- Before the lapse sweep (`lapsed`): the rows of the sequences it may end a member of.
SELECT s.name FROM slotd_sequences s
WHERE s.name IN (SELECT t.sequence FROM slotd_tasks t
                 WHERE t.lease_token IS NOT NULL AND t.attempt_count >= t.max_attempts
                   AND t.lease_expires_at <= now() AND t.sequence IS NOT NULL)
ORDER BY s.name
FOR UPDATE OF s

-- name: sequence_lock_targets
-- Before an operator's action on tasks (cancel; `dead`: a dead purge): the rows of the
-- sequences of the tasks it may end, in name order, so the action's statements after it
-- see every member enqueued before.
SELECT s.name FROM slotd_sequences s
WHERE s.name IN (
    SELECT t.sequence FROM slotd_tasks t
    WHERE t.sequence IS NOT NULL AND (NOT %(dead)s::bool OR {dead})
      AND (%(ids)s::bigint[] IS NULL OR t.id = ANY(%(ids)s::bigint[]))
      AND (%(task_type)s::text IS NULL OR t.task_type = %(task_type)s)
      AND (%(key)s::text IS NULL OR t.key = %(key)s OR t.started_key = %(key)s))
ORDER BY s.name
FOR UPDATE OF s

-- name: sequence_passed
-- After an operator's cancel (in its transaction, after sequence_lock_targets): the members
-- it ended (not those still running: their slot's settlement ends them) move their
-- sequences on.
WITH seq_ended(id, sequence, halts) AS (
    SELECT t.id, t.sequence, false FROM slotd_tasks t
    WHERE t.id = ANY(%(ids)s::bigint[]) AND t.sequence IS NOT NULL
), {sequence_moved}
SELECT count(*) FROM seq_next

-- name: sequence_advance
-- Sequences whose rows this transaction holds (sequence_enter, sequence_lock_*,
-- sequence_resume), moved on after an operator's action ended some of their members: the
-- head made due where it waits, unless the sequence is halted.
WITH seq_ended(id, sequence, halts) AS (
    SELECT NULL::bigint, n.name, false FROM unnest(%(names)s::text[]) AS n(name)
), {sequence_moved}
SELECT count(*) FROM seq_next

-- name: sequence_resume
-- An operator's resume of a halted sequence (slotd.resume_sequence, `slotd sequences
-- resume`): the halt cleared, under the row lock; then sequence_advance, in a new
-- statement, makes its next member due. The failed member stays a dead letter.
UPDATE slotd_sequences s
SET halted_by = NULL, halted_at = NULL, updated_at = now()
FROM (SELECT o.name, o.halted_by FROM slotd_sequences o
      WHERE o.name = ANY(%(names)s::text[]) FOR UPDATE) old
WHERE s.name = old.name
RETURNING s.name, old.halted_by

-- name: sequences_list
-- `slotd sequences`, `slotd status`: sequences with members or a halt, the halted first.
SELECT s.name, s.halted_by, s.halted_at, h.task_type, h.last_error,
       (SELECT count(*) FROM slotd_tasks t
        WHERE t.sequence = s.name AND {sequence_holding}) AS holding,
       (SELECT t.id FROM slotd_tasks t
        WHERE t.sequence = s.name AND {sequence_holding}
        ORDER BY t.sequence_pos LIMIT 1) AS head
FROM slotd_sequences s
LEFT JOIN slotd_tasks h ON h.id = s.halted_by
WHERE (%(halted)s::bool IS NOT TRUE OR s.halted_by IS NOT NULL)
  AND (%(name)s::text IS NULL OR s.name = %(name)s)
ORDER BY s.halted_by IS NULL, s.name
LIMIT %(limit)s

-- name: sequences_halted_count
SELECT count(*) FROM slotd_sequences s WHERE s.halted_by IS NOT NULL

-- fragment: sequence_moved
-- The end of members of sequences, from the statement's `seq_ended(id, sequence, halts)`
-- (halts: a failure that halts its sequence), under the sequences' row locks taken by an
-- earlier statement of the transaction (sequence_lock_*): a failure that halts records the
-- halt (halted_by); the end of the member a halt waits on (a `dead retry` of it that
-- succeeded, its purge) clears it; then each sequence not halted makes its head due if it
-- waits (its priority's head start kept, as a dependant's release does), with a wake sent at
-- commit. Members ended by the same statement are not heads: `ids`.
seq_state AS (
    UPDATE slotd_sequences s
    SET halted_by = CASE WHEN e.halt_id IS NOT NULL THEN e.halt_id
                         WHEN s.halted_by = ANY(e.ids)
                              OR NOT EXISTS (SELECT 1 FROM slotd_tasks h
                                             WHERE h.id = s.halted_by) THEN NULL
                         ELSE s.halted_by END,
        halted_at = CASE WHEN e.halt_id IS NOT NULL THEN now()
                         WHEN s.halted_by = ANY(e.ids)
                              OR NOT EXISTS (SELECT 1 FROM slotd_tasks h
                                             WHERE h.id = s.halted_by) THEN NULL
                         ELSE s.halted_at END,
        updated_at = now()
    FROM (SELECT x.sequence, array_remove(array_agg(x.id), NULL) AS ids,
                 min(x.id) FILTER (WHERE x.halts) AS halt_id
          FROM seq_ended x WHERE x.sequence IS NOT NULL
          GROUP BY x.sequence) e
    WHERE s.name = e.sequence
    RETURNING s.name, s.halted_by, e.ids
), seq_next AS (
    UPDATE slotd_tasks t
    SET run_at = now(),
        order_at = now() - make_interval(secs => t.priority * %(step_s)s::float8),
        sequence_waiting = false
    FROM seq_state st
    CROSS JOIN LATERAL (
        SELECT t.id FROM slotd_tasks t
        WHERE t.sequence = st.name AND t.id <> ALL(st.ids) AND {sequence_holding}
        ORDER BY t.sequence_pos
        LIMIT 1
    ) nx
    WHERE st.halted_by IS NULL AND t.id = nx.id AND t.sequence_waiting
    RETURNING t.id, pg_notify('slotd_wake', '') AS woken
)

-- name: debounce_lock
-- A debounced enqueue (enqueue(..., key=K, debounce=td), slotd/producer/debounce.py),
-- first, in its own statement: the key's lock, held to the enqueuer's commit, so two
-- producers of one burst never both insert (the second one's push, in a new statement after
-- the wait, sees the first one's row; pg-boss #414 made several jobs of one key under load).
SELECT pg_advisory_xact_lock(
    hashtextextended('slotd.debounce:' || %(task_type)s || ':' || %(key)s, 0))

-- name: debounce_push
-- Then: the key's task that has not started (a debounced row is unique="pending": its claim
-- gives the key up, so an enqueue while it runs queues one more) takes this enqueue's
-- payload (unless keep_first) and is due `delay_s` from now, but never later than `max_s`
-- after the burst's first enqueue (created_at); its priority's head start kept. Locked by
-- the update, so a claim passes it over until the enqueuer commits. No row: insert one.
UPDATE slotd_tasks t
SET payload = CASE WHEN %(keep_first)s::bool THEN t.payload ELSE %(payload)s::jsonb END,
    run_at = least(now() + make_interval(secs => %(delay_s)s),
                   coalesce(t.created_at + make_interval(secs => %(max_s)s), 'infinity')),
    order_at = least(now() + make_interval(secs => %(delay_s)s),
                     coalesce(t.created_at + make_interval(secs => %(max_s)s), 'infinity'))
               - {head_start}
WHERE t.task_type = %(task_type)s AND t.key = %(key)s AND t.unique_pending
  AND t.lease_token IS NULL AND t.attempt_count < t.max_attempts AND {unexpired}
  AND isfinite(t.run_at)
RETURNING t.id

-- fragment: shared_full
-- The types under a shared limit whose max_running is reached (Registry.limit): each limit's
-- live leases counted once, over all of its types. Uncorrelated: read once per statement
-- (a hashed SubPlan), whatever the number of rows or types it is tested against.
-- shared_types / shared_names / shared_max / shared_max_group are parallel arrays, one
-- entry per (type, limit) (slotd.registry shared_rows). settling / settling_token: the row
-- the same statement is dequeuing, whose place is free (as in within_limits).
SELECT x.task_type
FROM unnest(%(shared_types)s::text[], %(shared_names)s::text[]) AS x(task_type, name)
WHERE x.name IN (
    SELECT lim.name
    FROM (SELECT DISTINCT m.name, m.most
          FROM unnest(%(shared_names)s::text[], %(shared_max)s::int[]) AS m(name, most)
          WHERE m.most IS NOT NULL) lim
    WHERE (SELECT count(*) FROM slotd_tasks l
           WHERE l.task_type IN (SELECT y.task_type
                                 FROM unnest(%(shared_types)s::text[],
                                             %(shared_names)s::text[]) AS y(task_type, name)
                                 WHERE y.name = lim.name)
             AND l.lease_token IS NOT NULL AND l.lease_expires_at > now()
             AND NOT coalesce(l.id = %(settling)s::bigint
                              AND l.lease_token = %(settling_token)s::uuid, false))
          >= lim.most)

-- predicate: within_shared
-- Shared limits (Registry.limit, a handler's limits=[...]): the row's type is not under a
-- limit that is full (shared_full), nor, for a limit with max_running_per_group, one whose
-- count over the row's group across all its types is reached. A type under none is one
-- array test. Race-safe only under the claim lock of each limit ('@name', taken with the
-- types', sorted: see claim_lock), like within_limits, which splices it. In a CASE, so the
-- planner never makes the NOT EXISTS an anti-join over every due row: a discovery must stop
-- at its LIMIT.
(CASE WHEN t.task_type <> ALL(%(shared_types)s::text[]) THEN true
 ELSE t.task_type NOT IN ({shared_full})
  AND (t.task_group IS NULL OR NOT EXISTS (
    SELECT 1
    FROM unnest(%(shared_types)s::text[], %(shared_names)s::text[],
                %(shared_max_group)s::int[]) AS m(task_type, name, most_group)
    WHERE m.task_type = t.task_type AND m.most_group IS NOT NULL
      AND (SELECT count(*) FROM slotd_tasks l
           WHERE l.task_type IN (SELECT x.task_type
                                 FROM unnest(%(shared_types)s::text[],
                                             %(shared_names)s::text[]) AS x(task_type, name)
                                 WHERE x.name = m.name)
             AND l.task_group = t.task_group
             AND l.lease_token IS NOT NULL AND l.lease_expires_at > now()
             AND NOT coalesce(l.id = %(settling)s::bigint
                              AND l.lease_token = %(settling_token)s::uuid, false))
          >= m.most_group)) END)

-- predicate: shared_open
-- The discovery's type_open for shared limits: a type under a full limit is closed before
-- its rows are read (a filter per row would walk its whole due range).
(s.task_type NOT IN ({shared_full}))

-- predicate: within_shared_rates
-- A shared limit's rate (N, window): its starts are counted in a window of their own,
-- task_type '@name' in slotd_rate_windows (sql/022), as within_rates counts a type's. In a
-- CASE, as within_shared.
(CASE WHEN t.task_type <> ALL(%(shared_types)s::text[]) THEN true ELSE NOT EXISTS (
    SELECT 1
    FROM unnest(%(shared_types)s::text[], %(shared_names)s::text[], %(shared_rate_n)s::int[],
                %(shared_rate_s)s::float8[]) AS m(task_type, name, rate_n, rate_s)
    JOIN slotd_rate_windows w
      ON w.task_type = '@' || m.name AND NOT w.per_group AND w.task_group = ''
    JOIN slotd_rate_starts rs
      ON rs.task_type = w.task_type AND rs.per_group = w.per_group
     AND rs.task_group = w.task_group AND rs.seq = w.last_seq + 1 - m.rate_n
    WHERE m.task_type = t.task_type AND m.rate_n IS NOT NULL
      AND rs.started_at > clock_timestamp() - make_interval(secs => m.rate_s)) END)

-- fragment: shared_rate_starts
-- claim_rate_record's rows for the shared limits with a rate that the picked row's type is
-- under: each start counted in the limit's own window ('@name', within_shared_rates).
UNION ALL
SELECT '@' || m.name, false, '', m.rate_n, m.rate_s, clock_timestamp()
FROM picked p
JOIN unnest(%(shared_types)s::text[], %(shared_names)s::text[], %(shared_rate_n)s::int[],
            %(shared_rate_s)s::float8[]) AS m(task_type, name, rate_n, rate_s)
  ON m.task_type = p.task_type
WHERE m.rate_n IS NOT NULL AND EXISTS (SELECT 1 FROM claimed)

-- name: discover_fair
-- `discover` for a registry with fair types (@registry.handler(..., fair=True)): the same,
-- but a fair type's candidates take turns by group, round robin: the type's groups with live
-- rows in name order, starting after the group that started last (slotd_turns, stamped by
-- claim_ctes_fair) and wrapping around, each offering its oldest claimable row (by the ordering
-- key); then its ungrouped rows, as one more group, among its next %(fair_window)s. The
-- groups are enumerated by a loose scan of slotd_tasks_fair (one descent per group, at most
-- %(limit)s groups from each side of the last one, never a walk of a group's backlog), so a
-- group with 100,000 queued costs what a group with one does, and every group with work is
-- offered within one round. The rows are given the type's own ordering keys in that order
-- (nth_value), so the merge with the other types keeps the fair type's place in time while
-- its rows go in turns (by their rank among equal keys).
(SELECT d.id, d.task_type, NULL::float8 AS wait_s
 FROM (SELECT DISTINCT s.task_type FROM unnest(%(types)s::text[]) AS s(task_type)
       WHERE {type_open}) served
 CROSS JOIN LATERAL (
     (SELECT t.id, t.task_type, t.order_at, 0::bigint AS turn_rank FROM slotd_tasks t
      WHERE t.task_type = served.task_type AND served.task_type <> ALL(%(fair)s::text[])
        AND {claimable} AND {in_order_window} AND {within_limits} AND {group_rate_open}
      ORDER BY t.order_at, t.id
      LIMIT %(limit)s)
     UNION ALL
     (SELECT r.id, r.task_type, r.sort_at, r.turn FROM (
         SELECT h.id, h.task_type, h.turn,
                nth_value(h.order_at, h.turn::int) OVER (
                    ORDER BY h.order_at, h.id
                    ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) AS sort_at
         FROM (
             SELECT f.id, f.task_type, f.order_at,
                    row_number() OVER (ORDER BY f.place, g.lap, g.task_group) AS turn
             FROM (
                 WITH RECURSIVE last AS (
                     SELECT coalesce((SELECT x.task_group FROM slotd_turns x
                                      WHERE x.task_type = served.task_type
                                      ORDER BY x.started_at DESC LIMIT 1), '') AS task_group
                 ), after_last(task_group, n) AS (
                     SELECT (SELECT t.task_group FROM slotd_tasks t
                             WHERE t.task_type = served.task_type
                               AND served.task_type = ANY(%(fair)s::text[])
                               AND t.task_group > (SELECT l.task_group FROM last l)
                               AND t.attempt_count < t.max_attempts
                             ORDER BY t.task_group LIMIT 1), 1
                     UNION ALL
                     SELECT (SELECT t.task_group FROM slotd_tasks t
                             WHERE t.task_type = served.task_type
                               AND t.task_group > a.task_group
                               AND t.attempt_count < t.max_attempts
                             ORDER BY t.task_group LIMIT 1), a.n + 1
                     FROM after_last a WHERE a.task_group IS NOT NULL AND a.n < %(limit)s
                 ), from_start(task_group, n) AS (
                     SELECT (SELECT t.task_group FROM slotd_tasks t
                             WHERE t.task_type = served.task_type
                               AND served.task_type = ANY(%(fair)s::text[])
                               AND t.task_group >= '' AND t.attempt_count < t.max_attempts
                             ORDER BY t.task_group LIMIT 1), 1
                     UNION ALL
                     SELECT (SELECT t.task_group FROM slotd_tasks t
                             WHERE t.task_type = served.task_type
                               AND t.task_group > b.task_group
                               AND t.attempt_count < t.max_attempts
                             ORDER BY t.task_group LIMIT 1), b.n + 1
                     FROM from_start b
                     WHERE b.task_group IS NOT NULL AND b.n < %(limit)s
                       AND b.task_group < (SELECT l.task_group FROM last l)
                 )
                 SELECT w.lap, w.task_group, count(*) OVER () AS groups FROM (
                     SELECT 0 AS lap, a.task_group FROM after_last a
                     WHERE a.task_group IS NOT NULL
                     UNION ALL
                     SELECT 1, b.task_group FROM from_start b, last l
                     WHERE b.task_group IS NOT NULL AND b.task_group <= l.task_group) w
             ) g
             CROSS JOIN LATERAL (
                 -- Each group's oldest rows, enough between them for a discovery's size:
                 -- every group's first, then every group's second...
                 SELECT t.id, t.task_type, t.order_at,
                        row_number() OVER (ORDER BY t.order_at, t.id) AS place
                 FROM slotd_tasks t
                 WHERE t.task_type = served.task_type AND t.task_group = g.task_group
                   AND {claimable} AND {in_order_window} AND {within_limits}
                   AND {group_rate_open}
                 ORDER BY t.order_at, t.id
                 LIMIT ceil(%(limit)s::float8 / g.groups)::int) f
             UNION ALL
             (SELECT u.id, u.task_type, u.order_at, 1000000 AS turn FROM (
                 SELECT t.id, t.task_type, t.order_at, t.task_group FROM slotd_tasks t
                 WHERE t.task_type = served.task_type
                   AND served.task_type = ANY(%(fair)s::text[])
                   AND {claimable} AND {in_order_window} AND {within_limits}
                 ORDER BY t.order_at, t.id
                 LIMIT %(fair_window)s) u
              WHERE u.task_group IS NULL
              LIMIT %(limit)s)
         ) h
     ) r
     ORDER BY r.turn
     LIMIT %(limit)s)
 ) d
 ORDER BY d.order_at, d.turn_rank, d.id
 LIMIT %(limit)s)
UNION ALL
{discover_waits}

-- fragment: turn_taken
-- A fair type's start stamps its group's turn (discover_fair ranks groups by it): in the
-- claim's statement, after the lease is taken. A row without a group is the group ''.
turn_taken AS (
    INSERT INTO slotd_turns AS g (task_type, task_group, started_at)
    SELECT c.task_type, coalesce(m.task_group, ''), clock_timestamp()
    FROM claimed c JOIN slotd_tasks m ON m.id = c.id
    WHERE c.task_type = ANY(%(fair)s::text[])
    ON CONFLICT (task_type, task_group) DO UPDATE SET started_at = excluded.started_at
)

-- fragment: claim_ctes_fair
-- The claim part (slotd/repository/composed.py, "fair") when a candidate may be of a fair
-- type: claim_ctes, and its group's turn stamped in the same statement (`turn_taken`),
-- alone or riding on a settlement as any claim does.
{claim_ctes}, {turn_taken}

-- fragment: claim_ctes_fair_rated
{claim_ctes_rated}, {turn_taken}

-- name: turns_prune
-- The retention chore: turns of groups that started nothing for the retention's length
-- (a group seen once, a type no longer fair). A group met again starts as never started.
DELETE FROM slotd_turns g
WHERE (g.task_type, g.task_group) IN (
    SELECT x.task_type, x.task_group FROM slotd_turns x
    WHERE x.started_at < now() - make_interval(secs => %(retention_s)s)
    LIMIT %(batch)s)

-- fragment: shared_rate_waits
-- discover_waits' row for each full window of a shared rate ('@name'): in how many seconds
-- it has room again, which no notification announces (the slot's next wake).
UNION ALL
SELECT NULL, w.task_type, extract(epoch FROM min(w.free_at) - now())::float8
FROM slotd_rate_windows w
WHERE w.free_at > now() AND NOT w.per_group
  AND w.task_type IN (SELECT '@' || n.name
                      FROM unnest(%(shared_names)s::text[], %(shared_rate_n)s::int[])
                           AS n(name, rate_n)
                      WHERE n.rate_n IS NOT NULL)
GROUP BY w.task_type
