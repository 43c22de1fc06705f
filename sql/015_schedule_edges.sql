-- Schedules at their edges (#25): which declaration a schedule's row holds, and since when.
--
-- fingerprint: the declaring replica's digest of its whole declaration (task type,
-- expression, zone, catch-up, overlap, payload); a replica fires a schedule only while the
-- row holds its own declaration, so two versions of an application declaring one name
-- during a rolling deploy never both fire. declared_at: when (database clock) the replica
-- whose declaration the row holds first declared it; a differing declaration replaces the
-- row's only if it is newer, or if no live replica declares the row's any more.
-- Both NULL on rows an older release wrote: any current declaration replaces those.
ALTER TABLE slotd_schedules
    ADD COLUMN fingerprint text,
    ADD COLUMN declared_at timestamptz;

-- Each live replica's fingerprints, parallel to `schedules`: whether anyone still declares
-- what a row holds. NULL from an older release's replicas.
ALTER TABLE slotd_schedule_declarations ADD COLUMN fingerprints text[];
