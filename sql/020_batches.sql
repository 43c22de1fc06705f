-- Batches (slotd.batch(conn, on_complete=(type, payload))). Additive: a column with no
-- default on slotd_tasks (no rewrite) and two tables; replicas of 0.1.0 never read them.
--
-- A batch's tasks carry its id. Their ends are counted on the batch's stripes (one row
-- per task id modulo 16), never by a count over the batch's tasks, and not all on one
-- row: settlements of one batch from many slots then rarely wait on each other's row
-- lock. A stripe whose last task ended moves its counts to the batch row and takes one
-- off stripes_left; the settlement that takes the last one off enqueues the callback in
-- its own statement (sql `batch_counted`), so it is enqueued exactly once, in the
-- transaction that settled the batch's last task.
ALTER TABLE slotd_tasks ADD COLUMN IF NOT EXISTS batch_id bigint;

CREATE TABLE IF NOT EXISTS slotd_batches (
    id                    bigserial   PRIMARY KEY,
    callback_type         text        NOT NULL,
    callback_payload      jsonb       NOT NULL DEFAULT '{}',
    max_attempts          integer     NOT NULL,
    max_attempts_explicit boolean     NOT NULL DEFAULT false,
    total                 integer     NOT NULL DEFAULT 0,
    -- NULL until the batch's block ended (sealed): no stripe completes the batch before.
    stripes_left          integer,
    succeeded             integer     NOT NULL DEFAULT 0,
    failed                integer     NOT NULL DEFAULT 0,
    cancelled             integer     NOT NULL DEFAULT 0,
    expired               integer     NOT NULL DEFAULT 0,
    callback_id           bigint,
    created_at            timestamptz NOT NULL DEFAULT now(),
    sealed_at             timestamptz,
    completed_at          timestamptz
);
-- The batches in flight (slotd status, the dashboard) without reading completed ones.
CREATE INDEX IF NOT EXISTS slotd_batches_open ON slotd_batches (id) WHERE completed_at IS NULL;
CREATE INDEX IF NOT EXISTS slotd_batches_completed ON slotd_batches (completed_at)
    WHERE completed_at IS NOT NULL;

CREATE TABLE IF NOT EXISTS slotd_batch_stripes (
    batch_id  bigint   NOT NULL,
    stripe    smallint NOT NULL,
    remaining integer  NOT NULL DEFAULT 0,
    succeeded integer  NOT NULL DEFAULT 0,
    failed    integer  NOT NULL DEFAULT 0,
    cancelled integer  NOT NULL DEFAULT 0,
    expired   integer  NOT NULL DEFAULT 0,
    PRIMARY KEY (batch_id, stripe)
);
