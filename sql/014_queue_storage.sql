-- The queue table's storage settings, chosen for a queue (#26). slotd_tasks is written and
-- deleted at the rate of the work: every task is one insert, one or more updates (claim,
-- settlement) and one delete, so it makes dead tuples as fast as it drains, and it swings
-- from empty to a burst's size and back. Measured with tests/bench/queue_storage.py drains
-- (eight 20k no-op drains in a row at 4 slots, fsync on; figures in tests/bench/RESULTS.md).
-- Expand only: storage parameters, no rewrite (fillfactor applies to pages written later).
ALTER TABLE slotd_tasks SET (
    -- Never truncate the table's empty tail at the end of a vacuum. A drained queue is
    -- mostly empty pages at the end of the file: truncating them takes an ACCESS EXCLUSIVE
    -- lock on the table (every claim, settlement and enqueue queues behind it, or the
    -- vacuum gives up after waiting for them), and the next burst extends the file again
    -- page by page. Keeping the pages costs disk the next burst reuses.
    vacuum_truncate = false,
    -- Vacuum this table unthrottled. The default cost delay (2 ms every 200 cost units)
    -- stretches a vacuum of a 20-30 MB queue table, dirtying every page it cleans, over
    -- seconds while the dead tuples it is there for keep coming; an unthrottled pass over
    -- a table this size is short, and the table stays at its working size.
    autovacuum_vacuum_cost_delay = 0,
    -- Trigger on dead tuples early, as sql/001 already did (1,000 plus 1% of the rows;
    -- PostgreSQL's default waits for 20%): restated here so the table's whole policy reads
    -- in one place. The 1% keeps a table that also holds many dead letters (live rows
    -- until retention deletes them) from being vacuumed for every thousand deletes.
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_scale_factor = 0.01,
    -- Planner statistics after 2% of the rows change (as sql/001): the table's size swings
    -- by orders of magnitude and the claim's and discovery's plans are chosen on it.
    autovacuum_analyze_scale_factor = 0.02,
    -- Room on each page for the claim's and the settlement's new row versions (as
    -- sql/001): an update lands on the row's own page, so a task's life dirties one page.
    fillfactor = 70
);
