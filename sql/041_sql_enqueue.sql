-- Enqueue from SQL (#40): slotd_enqueue(task_type, payload, key =>, delay =>, run_at =>,
-- priority =>, task_group =>, max_attempts =>, tags =>) writes the row slotd.enqueue writes,
-- in the caller's transaction (a trigger, a migration, another language's driver), with the
-- same dedupe (a live task with the key: its id comes back, nothing is written) and the same
-- wake (pg_notify on the schema's channel, delivered only if the caller commits, when the
-- task is due now). Returns the task's id. Bad input raises before anything is written
-- (SQLSTATE 22023). Additive: a new function; replicas of the previous release never call it.
--
-- It mirrors sql/queries.sql `enqueue` for unique="live" (the dedupe's `live` predicate
-- inlined below; a later change to either changes both: tests/test_sql_enqueue.py pins them
-- against each other). What it does not take: unique="pending", after=, expires_in=, a trace
-- context. max_attempts NULL: a provisional 20 that the claiming worker replaces with its
-- SLOTD_MAX_ATTEMPTS, as for a Python enqueue without max_attempts=; a priority point is a
-- second of head start (SLOTD_PRIORITY_STEP's default).
--
-- search_path FROM CURRENT: `slotd migrate` runs this with search_path set to slotd's schema
-- (and qualifies every slotd_ name in it for a named SLOTD_SCHEMA), so the function finds its
-- tables whatever the caller's search_path is.
CREATE OR REPLACE FUNCTION slotd_enqueue(
    task_type text,
    payload jsonb DEFAULT '{}'::jsonb,
    key text DEFAULT NULL,
    delay interval DEFAULT NULL,
    run_at timestamptz DEFAULT NULL,
    priority integer DEFAULT 0,
    task_group text DEFAULT NULL,
    max_attempts integer DEFAULT NULL,
    tags text[] DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
#variable_conflict use_column
DECLARE
    -- The arguments by position: their names are the table's column names.
    v_type text := $1;
    v_payload jsonb := coalesce($2, '{}'::jsonb);
    v_key text := $3;
    v_due timestamptz;
    v_priority integer := coalesce($6, 0);
    v_group text := $7;
    v_max integer := $8;
    v_tags text[];
    v_id bigint;
BEGIN
    IF v_type IS NULL OR v_type !~ '^[a-z][a-z0-9_.:-]{0,127}$' THEN
        RAISE EXCEPTION 'slotd_enqueue: invalid task type %: use lower case letters, digits and _ . : -, starting with a letter, at most 128 characters', coalesce(quote_literal(v_type), 'NULL')
            USING ERRCODE = '22023';
    END IF;
    IF jsonb_typeof(v_payload) <> 'object' THEN
        RAISE EXCEPTION 'slotd_enqueue: task %: payload must be a JSON object, not %', quote_literal(v_type), jsonb_typeof(v_payload)
            USING ERRCODE = '22023';
    END IF;
    IF $4 IS NOT NULL AND $5 IS NOT NULL THEN
        RAISE EXCEPTION 'slotd_enqueue: task %: give run_at or delay, not both', quote_literal(v_type)
            USING ERRCODE = '22023';
    END IF;
    IF v_priority NOT BETWEEN -100 AND 100 THEN
        RAISE EXCEPTION 'slotd_enqueue: task %: priority must be from -100 to 100, got %', quote_literal(v_type), v_priority
            USING ERRCODE = '22023';
    END IF;
    IF v_max IS NOT NULL AND v_max < 1 THEN
        RAISE EXCEPTION 'slotd_enqueue: task %: max_attempts must be at least 1', quote_literal(v_type)
            USING ERRCODE = '22023';
    END IF;
    IF $9 IS NOT NULL THEN
        SELECT CASE WHEN count(*) = 0 THEN NULL ELSE array_agg(tag ORDER BY first) END INTO v_tags
        FROM (SELECT tag, min(n) AS first FROM unnest($9) WITH ORDINALITY AS u(tag, n)
              WHERE tag IS NOT NULL AND tag <> '' GROUP BY tag) uniq;
    END IF;
    v_due := coalesce($5, now() + coalesce($4, interval '0'));

    FOR attempt IN 1..5 LOOP
        IF v_key IS NOT NULL THEN
            -- queries.sql `live`, inlined: the live task holding the key, if any.
            SELECT t.id INTO v_id FROM slotd_tasks t
            WHERE t.task_type = v_type AND t.key = v_key
              AND ((t.attempt_count < t.max_attempts
                    AND ((t.expires_at IS NULL OR t.expires_at > now())
                         OR (t.lease_expires_at IS NOT NULL AND t.lease_expires_at > now())))
                   OR (t.lease_expires_at IS NOT NULL AND t.lease_expires_at > now()
                       AND t.cancelled_at IS NULL))
            ORDER BY t.id LIMIT 1;
            IF v_id IS NOT NULL THEN
                RETURN v_id;
            END IF;
        END IF;
        INSERT INTO slotd_tasks AS t (task_type, payload, key, run_at, max_attempts,
                                      max_attempts_explicit, priority, task_group, order_at,
                                      tags)
        VALUES (v_type, v_payload, v_key, v_due, coalesce(v_max, 20), v_max IS NOT NULL,
                v_priority, v_group, v_due - make_interval(secs => v_priority), v_tags)
        ON CONFLICT (task_type, key) WHERE key IS NOT NULL AND attempt_count < max_attempts
        DO NOTHING
        RETURNING t.id INTO v_id;
        IF v_id IS NOT NULL THEN
            IF v_due <= now() THEN
                PERFORM pg_notify('slotd_wake', '');
            END IF;
            RETURN v_id;
        END IF;
        -- Met a concurrent enqueue of the key: look again (its row is committed now).
    END LOOP;
    RAISE EXCEPTION 'slotd_enqueue: task % key %: held by a task that is neither live nor ended (an expired one the sweep has not reached); try again', quote_literal(v_type), quote_literal(v_key)
        USING ERRCODE = '55000';
END
$fn$;
