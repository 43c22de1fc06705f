-- Batched claims and settlements (#43): when the backlog is deep and handlers are short, a
-- slot claims several tasks in one statement and settles several plain successes in one
-- statement. Every task keeps its own lease: its own random token (drawn by the slot, 128
-- bits each, so a lost answer can be asked about: held_leases), its own lease stamp and the
-- deadline derived from it; every settlement is fenced on each task's own token. The rules
-- (what may be batched, how long a prefetched task may wait) are in slotd/lifecycle's rule
-- book, "batched"; these statements sit beside the single-row ones, which they do not change.

-- fragment: claim_picked_many
-- claim_picked for up to %(n)s rows, in the candidates' order. Only %(batchable)s types: a
-- type with a concurrency limit, a rate, a shared limit or fair turns (#39) is claimed one
-- row per statement (claim_picked
-- under claim_lock, within_limits and within_rates count the leases a statement can see, and
-- rows leased by the same statement are not among them). The same MATERIALIZED guard, the
-- same lateral lookup by primary key, the same SKIP LOCKED and recheck; the LIMIT stops the
-- walk at the n-th claimable candidate, so no row past it is locked.
picked AS MATERIALIZED (
    SELECT l.id, c.ord, l.lapsed_at, l.lapsed_started
    FROM unnest(%(ids)s::bigint[]) WITH ORDINALITY AS c(id, ord)
    CROSS JOIN LATERAL (
        SELECT t.id, {lapsed_lease} FROM slotd_tasks t
        WHERE t.id = c.id AND {claimable}
          AND t.task_type = ANY(%(batchable)s::text[])
        LIMIT 1
        FOR UPDATE OF t SKIP LOCKED
    ) l
    LIMIT %(n)s
), numbered AS (
    -- Each row its own token, the k-th claimable candidate the k-th of the slot's tokens.
    SELECT p.id, (%(lease_tokens)s::uuid[])[row_number() OVER (ORDER BY p.ord)] AS token,
           p.lapsed_at, p.lapsed_started
    FROM picked p
)

-- fragment: claim_lease_many
-- claim_lease for every picked row, each with its own token: the same stamps (lease =
-- now() + the type's ceiling + margin, an attempt burnt), the same max_attempts and
-- unique="pending" rules, the same columns returned (repository.Claimed's order).
claimed AS (
    UPDATE slotd_tasks t
    SET lease_token = n.token,
        lease_expires_at = now() + c.ceiling + make_interval(secs => %(margin_s)s),
        attempt_count = t.attempt_count + 1,
        last_attempted_at = now(),
        max_attempts = CASE WHEN t.max_attempts_explicit THEN t.max_attempts
                            ELSE c0.max_attempts END,
        key = CASE WHEN t.unique_pending THEN NULL ELSE t.key END,
        started_key = CASE WHEN t.unique_pending THEN {task_key} ELSE t.started_key END
    FROM numbered n,
         unnest(%(types)s::text[], %(ceilings_s)s::float8[], %(max_attempts)s::int[])
             AS c0(task_type, ceiling_s, max_attempts),
         LATERAL (SELECT make_interval(secs => c0.ceiling_s) AS ceiling) c
    WHERE t.id = n.id AND c0.task_type = t.task_type
    RETURNING t.id, t.task_type, t.payload, {task_key}, t.run_at, t.attempt_count,
              t.max_attempts, t.lease_token, t.lease_expires_at, now() AS claimed_at,
              t.trace_context, t.has_dependants, {parent_results}, t.batch_id, t.steps,
              n.lapsed_at, n.lapsed_started
)

-- name: claim_many
-- Up to n tasks of the candidates, each under its own lease, in one statement.
WITH {claim_picked_many}, {claim_lease_many}
SELECT * FROM claimed

-- name: dequeue_many_claim_many
-- The plain successes a slot ran since its last statement, deleted, each fenced on its own
-- token ({unlinked} as `dequeue`: a row that gained dependants or is a batch's member is
-- refused here and settled by the linked statement), and up to n next tasks claimed, in
-- one statement: one round trip and one commit for all of them. The rows are distinct (a
-- settled row is leased, so never claimable). dequeued: the ids deleted; a claimed row per
-- line (none: one line of NULLs).
WITH done AS (
    DELETE FROM slotd_tasks t
    USING unnest(%(done_ids)s::bigint[], %(done_tokens)s::uuid[]) AS d(id, token)
    WHERE t.id = d.id AND t.lease_token = d.token AND {unlinked}
    RETURNING t.id
), {claim_picked_many}, {claim_lease_many}
SELECT (SELECT coalesce(array_agg(id), '{}') FROM done) AS dequeued, c.*
FROM (SELECT 1) AS one LEFT JOIN claimed c ON true

-- name: held_leases
-- The live leases under these tokens: a batched statement's claims, after its answer was
-- lost (see held_lease).
SELECT t.id, t.task_type, t.payload, {task_key}, t.run_at, t.attempt_count, t.max_attempts,
       t.lease_token, t.lease_expires_at, t.last_attempted_at AS claimed_at, t.trace_context,
       t.has_dependants, {parent_results}, t.batch_id, t.steps,
       NULL::timestamptz AS lapsed_at, NULL::timestamptz AS lapsed_started
FROM slotd_tasks t
WHERE t.lease_token = ANY(%(tokens)s::uuid[]) AND {lease_live}
