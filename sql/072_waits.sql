-- Durable sleeps and events (#38). A handler's ctx.sleep / ctx.wait_event ends its attempt
-- and frees its slot; the task is `waiting` (docs/ARCHITECTURE.md, "A task's states") until
-- its wake time or an emit of its event, then runs from the top with its steps replayed.
-- wait_step: the step the task is suspended on (NULL: not waiting on a sleep or an event);
-- wait_event: the event's name it waits for (NULL for a sleep); wait_until: its wake time
-- (a sleep's end, an event's timeout; NULL: an event waited for without a timeout).
-- Expand only: nullable columns, a new table, a new function; replicas of the previous
-- release neither read nor write them (they claim a woken task as any due task, and would
-- fail it for want of the handler's new code, as for any new handler).
ALTER TABLE slotd_tasks ADD COLUMN IF NOT EXISTS wait_step text,
                        ADD COLUMN IF NOT EXISTS wait_event text,
                        ADD COLUMN IF NOT EXISTS wait_until timestamptz;

-- The emit's look for its waiters: only waiting tasks are in it.
CREATE INDEX IF NOT EXISTS slotd_tasks_wait_event ON slotd_tasks (wait_event)
    WHERE wait_event IS NOT NULL;

-- Every emit, kept for SLOTD_RETENTION (the hourly retention prunes it), so a wait that
-- begins after its event was emitted still sees it.
CREATE TABLE IF NOT EXISTS slotd_events (
    id bigserial PRIMARY KEY,
    name text NOT NULL,
    data jsonb NOT NULL DEFAULT 'null'::jsonb,
    emitted_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS slotd_events_name ON slotd_events (name, id);
CREATE INDEX IF NOT EXISTS slotd_events_emitted ON slotd_events (emitted_at);

-- slotd_emit(name, data): an event, in the caller's transaction (slotd.emit calls it; so
-- may a trigger or any language's driver). It takes the event's advisory lock first, as a
-- wait does before it looks (sql/queries.sql `wait_step`), each in its own statement so
-- the next statement's snapshot sees what the other committed: an emit and a wait of the
-- same name are ordered, and either the wait sees the emit or the emit sees the wait. Its
-- waiters are made due at once, and a slot woken, only if the caller commits: a rolled
-- back emit wakes nobody and leaves no event. Returns how many waiting tasks it woke.
-- search_path FROM CURRENT: `slotd migrate` runs this with search_path set to slotd's
-- schema, so the function finds its tables whatever the caller's search_path is.
CREATE OR REPLACE FUNCTION slotd_emit(name text, data jsonb DEFAULT 'null'::jsonb)
RETURNS bigint
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
DECLARE
    v_name text := $1;
    v_woken bigint;
BEGIN
    IF v_name IS NULL OR v_name = '' THEN
        RAISE EXCEPTION 'slotd_emit: an event needs a name' USING ERRCODE = '22023';
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended('slotd.event:' || v_name, 0));
    INSERT INTO slotd_events (name, data) VALUES (v_name, coalesce($2, 'null'::jsonb));
    -- Its priority's head start kept; a wait without a timeout has none to keep (its
    -- run_at and order_at are 'infinity', and infinity - infinity is an error).
    UPDATE slotd_tasks t
    SET run_at = now(),
        order_at = now() - CASE WHEN isfinite(t.run_at) THEN t.run_at - t.order_at
                                ELSE interval '0' END
    WHERE t.wait_event = v_name AND t.lease_token IS NULL
      AND t.attempt_count < t.max_attempts;
    GET DIAGNOSTICS v_woken = ROW_COUNT;
    IF v_woken > 0 THEN
        PERFORM pg_notify('slotd_wake', '');
    END IF;
    RETURN v_woken;
END
$fn$;
