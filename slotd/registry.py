"""Handlers by task type, each with the ceiling its lease is derived from."""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from slotd.errors import ConfigError

if TYPE_CHECKING:
    from slotd.task import Context, Task

HandlerFn = Callable[["Task", "Context"], Any]
TYPE_NAME = re.compile(r"^[a-z][a-z0-9_.:-]{0,127}$")


def validate_type_name(name: object) -> str:
    if not isinstance(name, str) or not TYPE_NAME.match(name):
        raise ValueError(
            f"invalid task type {name!r}: use lower case letters, digits and _ . : -, "
            "starting with a letter, at most 128 characters"
        )
    return name


def is_async(fn: object) -> bool:
    """An `async def` function, a partial of one, or an object whose __call__ is one."""
    call = type(fn).__dict__.get("__call__") if not inspect.isroutine(fn) else None
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)


@dataclass(frozen=True)
class Handler:
    name: str
    fn: HandlerFn
    ceiling: timedelta
    is_async: bool = False  # async def: the runner awaits it on its event loop


class Registry:
    """What this replica can run. A ceiling is required: it is the handler's deadline and,
    plus the margin, the lease and so the crash-recovery wait for the type."""

    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}

    def register(self, name: str, fn: HandlerFn, *, ceiling: timedelta) -> HandlerFn:
        validate_type_name(name)
        if name in self._handlers:
            raise ValueError(f"task type {name!r} is already registered")
        if not isinstance(ceiling, timedelta) or ceiling <= timedelta(0):
            raise ValueError(f"task type {name!r}: ceiling must be a positive timedelta")
        if not callable(fn):
            raise ValueError(f"task type {name!r}: handler must be callable")
        self._handlers[name] = Handler(name, fn, ceiling, is_async(fn))
        return fn

    def handler(self, name: str, *, ceiling: timedelta) -> Callable[[HandlerFn], HandlerFn]:
        def decorate(fn: HandlerFn) -> HandlerFn:
            return self.register(name, fn, ceiling=ceiling)

        return decorate

    def get(self, name: str) -> Handler | None:
        return self._handlers.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._handlers

    def __iter__(self) -> Iterator[Handler]:
        return iter(sorted(self._handlers.values(), key=lambda h: h.name))

    def __len__(self) -> int:
        return len(self._handlers)

    @property
    def types(self) -> list[str]:
        return sorted(self._handlers)

    @property
    def ceilings_seconds(self) -> list[float]:
        return [self._handlers[name].ceiling.total_seconds() for name in self.types]


def load_registry(spec: str) -> Registry:
    """Import `package.module:attr` and return the Registry it names."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"bad --app {spec!r}: write it as MODULE:ATTR")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"bad --app {spec!r}: cannot import {module_name}: {exc}") from None
    target: Any = module
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ConfigError(f"bad --app {spec!r}: {module_name} has no {attr}") from None
    if callable(target) and not isinstance(target, Registry):
        target = target()
    if not isinstance(target, Registry):
        raise ConfigError(f"bad --app {spec!r}: {attr} is not a slotd.Registry")
    if not len(target):
        raise ConfigError(f"bad --app {spec!r}: the registry has no handlers")
    return target
