-- Rates (#25): rate=(N, window) and rate_per_group=(N, window) on a handler: at most N
-- starts of the type (of the type and one group) in any window of that length, fleet-wide,
-- by the database's clock.
--
-- The rule is exact, not an estimate: a sequence of starts t1 <= t2 <= ... has at most N in
-- every window of length W exactly when each start comes at least W after the start N
-- places before it (t[i+N] - t[i] >= W). So a window is a bucket's last N starts, kept as
-- rows numbered by seq: a claim may start a task when the start N places back (seq =
-- last_seq - N + 1, one primary-key look-up, whatever N) is at least W old, or does not
-- exist. The claim records its start (seq + 1) and drops the one that fell out (seq + 1 -
-- N) in the same statement that takes the lease, under the type's limit lock (claim_lock),
-- so the starts are stamped in the order they happen and a committed lease always has its
-- start counted: a kill -9 after the claim, or a lease that lapses and is claimed again,
-- counts each start once, which is what the limit is about.
--
-- One row per bucket says where its window stands: its last seq, the limit the last start
-- was made under (for `slotd status`, which has no registry) and free_at, when the next
-- start may come. Discovery reads only free_at (a full type is not walked at all, and its
-- end is the slot's next wake); the claim decides from the starts themselves.
CREATE TABLE slotd_rate_windows (
    task_type     text        NOT NULL,
    per_group     boolean     NOT NULL,   -- false: the type's own window
    task_group    text        NOT NULL,   -- '' for the type's own window
    last_seq      bigint      NOT NULL,
    last_start_at timestamptz NOT NULL,
    allowed       integer     NOT NULL,
    window_s      float8      NOT NULL,
    free_at       timestamptz NOT NULL,
    PRIMARY KEY (task_type, per_group, task_group)
);

-- The windows that are full right now: discovery's look, a range of the few rows whose
-- free_at is still ahead.
CREATE INDEX slotd_rate_windows_free ON slotd_rate_windows (free_at);

CREATE TABLE slotd_rate_starts (
    task_type  text        NOT NULL,
    per_group  boolean     NOT NULL,
    task_group text        NOT NULL,
    seq        bigint      NOT NULL,
    started_at timestamptz NOT NULL,
    PRIMARY KEY (task_type, per_group, task_group, seq)
);
