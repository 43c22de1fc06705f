"""slotd as a Django 6 `django.tasks` backend (install `slotd[django]`).

settings.py::

    INSTALLED_APPS = [..., "slotd.contrib.django"]
    TASKS = {"default": {"BACKEND": "slotd.contrib.django.SlotdBackend"}}

and run the worker with ``slotd run --app slotd.contrib.django.worker:registry``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from slotd.contrib.django.backend import SlotdBackend, task_options

__all__ = ["SlotdBackend", "task_options"]


def __getattr__(name: str) -> Any:
    # Lazy, so INSTALLED_APPS can name this package before Django's app registry is ready.
    if name in __all__:
        from slotd.contrib.django import backend

        return getattr(backend, name)
    raise AttributeError(name)
