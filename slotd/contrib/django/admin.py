"""Django tasks' results and attempts in Django's admin, read-only: the list of results
(task, queue, status, times; filtered by status and queue, searched by task or id) and, per
result, what get_result() says (status corrected from the queue row, errors, worker ids)
and every attempt slotd remembers (number, outcome, worker, times, error).

Registered when slotd's tables are in the default schema (public): the model names its
table unqualified. With OPTIONS SCHEMA, use `slotd result ID` or the dashboard."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib import admin
from django.utils.html import format_html, format_html_join

from slotd.config import default_schema
from slotd.contrib.django.models import Result


def _schemas() -> set[str]:
    found = {default_schema()}
    for params in getattr(settings, "TASKS", {}).values():
        if str(params.get("BACKEND", "")).startswith("slotd."):
            found.add((params.get("OPTIONS") or {}).get("SCHEMA", default_schema()))
    return found


class ResultAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("task_path", "queue_name", "status", "enqueued_at", "finished_at", "id")
    list_filter = ("status", "queue_name")
    search_fields = ("task_path", "=id")
    date_hierarchy = "enqueued_at"
    readonly_fields = ("as_django_reports", "attempts")
    fields = (
        "id",
        "task_path",
        "backend",
        "queue_name",
        "priority",
        "task_id",
        "as_django_reports",
        "enqueued_at",
        "started_at",
        "last_attempted_at",
        "finished_at",
        "args",
        "kwargs",
        "return_value",
        "attempts",
    )

    def has_add_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    @admin.display(description="get_result()")
    def as_django_reports(self, obj: Result) -> str:
        from django.tasks import task_backends

        try:
            shown = task_backends[obj.backend].get_result(str(obj.id))
        except Exception as exc:  # noqa: BLE001 - an alias gone from TASKS, say so
            return f"cannot read it: {exc}"
        errors = "; ".join(e.exception_class_path for e in shown.errors) or "none"
        return format_html(
            "{} (attempts {}, errors: {}, workers: {})",
            shown.status,
            shown.attempts,
            errors,
            ", ".join(shown.worker_ids) or "none",
        )

    @admin.display(description="attempts (slotd)")
    def attempts(self, obj: Result) -> str:
        from django.tasks import task_backends

        from slotd.contrib.django.database import cursor
        from slotd.producer.results import attempts

        backend = task_backends[obj.backend]
        with cursor(backend.database) as cur:
            ran = attempts(cur, obj.task_id, schema=backend.schema)
        if not ran:
            return "none remembered"
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td><pre>{}</pre></td></tr>",
            (
                (
                    a.number,
                    a.outcome or "running",
                    a.worker or "",
                    a.started_at or "",
                    a.ended_at or "",
                    a.error or "",
                )
                for a in ran
            ),
        )
        names = ("#", "outcome", "worker", "started", "ended", "error")
        head = format_html_join("", "<th>{}</th>", ((n,) for n in names))
        return format_html("<table><tr>{}</tr>{}</table>", head, rows)


if _schemas() == {"public"}:
    admin.site.register(Result, ResultAdmin)
