"""Django's view of slotd's results table, for the admin (admin.py): unmanaged, so Django
never creates, alters or drops it (slotd's own SQL migrations own the table, sql/002).
Read-only everywhere: the worker and the backend write it through slotd's statements."""

from __future__ import annotations

from django.db import models


class Result(models.Model):
    """One row of slotd_django_results: a Django task's result as the task's code recorded
    it (`status` as stored: get_result corrects it from the queue row, see admin.py)."""

    id = models.UUIDField(primary_key=True)
    task_id = models.BigIntegerField("slotd task id")
    backend = models.TextField()
    queue_name = models.TextField()
    task_path = models.TextField("task")
    priority = models.IntegerField()
    status = models.TextField("stored status")
    enqueued_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True)
    finished_at = models.DateTimeField(null=True)
    last_attempted_at = models.DateTimeField(null=True)
    args = models.JSONField()
    kwargs = models.JSONField()
    return_value = models.JSONField(null=True)

    class Meta:
        managed = False
        db_table = "slotd_django_results"
        verbose_name = "task result"
        ordering = ["-enqueued_at"]

    def __str__(self) -> str:
        return f"{self.task_path} {self.id}"
