-- Who runs next (#39): sequences, and the statements beside them. The claim and the
-- settlements in queries.sql splice the fragments here; every statement aliases
-- slotd_tasks as t.

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
WITH input AS (
    SELECT i.id, i.name, i.pos
    FROM unnest(%(ids)s::bigint[], %(names)s::text[], %(positions)s::bigint[])
         AS i(id, name, pos)
), placed AS (
    SELECT i.id, i.name, i.pos,
           (s.halted_by IS NOT NULL
            OR i.pos > (SELECT min(j.pos) FROM input j WHERE j.name = i.name)
            OR EXISTS (SELECT 1 FROM slotd_tasks t
                       WHERE t.sequence = i.name AND t.id <> ALL(%(ids)s::bigint[])
                         AND {sequence_holding})) AS waits
    FROM input i JOIN slotd_sequences s ON s.name = i.name
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
