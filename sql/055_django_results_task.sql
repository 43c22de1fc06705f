-- Django's results by their slotd task (#37, #42): get_result reads a task's attempts from
-- slotd_attempts (sql/030), and the retention chore keeps those attempts while a Django
-- result still answers for the task, which it looks up here per attempt it would prune.
-- Expand only: an index; the previous release neither reads nor minds it.
CREATE INDEX IF NOT EXISTS slotd_django_results_task ON slotd_django_results (task_id);
