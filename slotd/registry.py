"""Handlers by task type, each with the ceiling its lease is derived from."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
import sysconfig
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, overload

from slotd import integrations
from slotd.config import max_attempts_value
from slotd.errors import ConfigError
from slotd.middleware import Chain, Middleware
from slotd.typed.handle import TaskHandle
from slotd.typed.models import P, PayloadModel

if TYPE_CHECKING:
    from slotd.schedule import Schedule
    from slotd.task import Context, Task

HandlerFn = Callable[["Task", "Context"], Any]
# backoff=(attempt, exception) -> timedelta: the delay before the next attempt.
Backoff = Callable[[int, BaseException], timedelta]
F = TypeVar("F", bound=Callable[..., Any])
# rate=(N, window): at most N starts in any window of that length.
Rate = tuple[int, timedelta]
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
    # Limits for this type; None: the worker's SLOTD_MAX_ATTEMPTS / SLOTD_BACKOFF_*.
    max_attempts: int | None = None
    backoff_base: timedelta | None = None
    backoff_cap: timedelta | None = None
    # Fleet-wide: at most this many of the type (of one group) under a live lease at once.
    max_running: int | None = None
    max_running_per_group: int | None = None
    # The registry's middleware (slotd.middleware), shared by its handlers: one added after
    # the handler was registered wraps it too.
    chain: Chain | None = field(default=None, compare=False, repr=False)
    # Store the JSON return value of a success for this long (slotd.result); None: dropped.
    keep_result: timedelta | None = None
    # Fleet-wide: at most N starts of the type (of one group) in any window of this length.
    rate: Rate | None = None
    rate_per_group: Rate | None = None
    # What the handler's exceptions decide (slotd/runner/decisions.py): only these are
    # retried (None: all), these are discarded at once, and the delay before a retry.
    retry_on: tuple[type[BaseException], ...] | None = None
    discard_on: tuple[type[BaseException], ...] = ()
    backoff: Backoff | None = field(default=None, compare=False)
    # A success stays answerable (its state and attempts, slotd.result) this long; its value
    # only with keep_result. None: the worker's SLOTD_KEEP_HISTORY, else not at all.
    keep_history: timedelta | None = None
    # payload=Model: task.payload is this model, built and validated at the claim
    # (slotd.typed.models); a payload it refuses is discarded, never retried. None: the dict.
    payload_model: PayloadModel[Any] | None = field(default=None, compare=False)
    # A task of a sequence (enqueue(sequence=)) that ends failed: "halt" its sequence until
    # an operator resumes it (`slotd sequences resume`), or "continue" with the next task.
    sequence_on_failure: str = "halt"
    # Limits shared with other types (Registry.limit), by name.
    shared_limits: tuple[str, ...] = ()
    # Its groups take turns for its slots (the one that started least recently first).
    fair: bool = False
    # A group may run this many above max_running_per_group while no other group of the
    # type has a due task waiting (the burst; 0: never above the cap).
    group_burst: int = 0

    def limits(self) -> tuple[int | None, float | None, float | None]:
        """As plain numbers, for the runner's hello to its slot."""
        return (self.max_attempts, _seconds(self.backoff_base), _seconds(self.backoff_cap))

    @property
    def limited(self) -> bool:
        """Under a concurrency limit (max_running or max_running_per_group)."""
        return self.max_running is not None or self.max_running_per_group is not None

    @property
    def rated(self) -> bool:
        return self.rate is not None or self.rate_per_group is not None


def _seconds(value: timedelta | None) -> float | None:
    return None if value is None else value.total_seconds()


def _exceptions(name: str, what: str, value: object) -> tuple[type[BaseException], ...] | None:
    """An exception type or a tuple of them, as a tuple; None when not given."""
    if value is None:
        return None
    types = value if isinstance(value, tuple) else (value,)
    if not all(isinstance(t, type) and issubclass(t, BaseException) for t in types):
        raise ValueError(f"task type {name!r}: {what} takes exception types, not {value!r}")
    return types


def _backoff(name: str, value: object) -> Backoff | None:
    if value is not None and not callable(value):
        raise ValueError(f"task type {name!r}: backoff must be a function (attempt, exc)")
    return value  # type: ignore[return-value]


def _positive(value: object, what: str) -> timedelta | None:
    if value is not None and (not isinstance(value, timedelta) or value <= timedelta(0)):
        raise ValueError(f"{what} must be a positive timedelta, not {value!r}")
    return value


def _rate(name: str, option: str, value: object) -> Rate | None:
    """(N, window): N a whole number of at least 1, the window a positive timedelta."""
    if value is None:
        return None
    if (
        not isinstance(value, tuple)
        or len(value) != 2
        or isinstance(value[0], bool)
        or not isinstance(value[0], int)
        or value[0] < 1
        or not isinstance(value[1], timedelta)
        or value[1] <= timedelta(0)
    ):
        raise ValueError(
            f"task type {name!r}: {option} must be (N, window): N starts, a whole number of "
            f"at least 1, per window, a positive timedelta; not {value!r}"
        )
    return (value[0], value[1])


def _burst(name: str, burst: object, per_group: int | None) -> None:
    """group_burst: a whole number of tasks, only above a per-group cap."""
    if isinstance(burst, bool) or not isinstance(burst, int) or burst < 0:
        raise ValueError(f"task type {name!r}: group_burst must be a whole number >= 0")
    if burst and per_group is None:
        raise ValueError(
            f"task type {name!r}: group_burst needs max_running_per_group (the cap it goes above)"
        )


def _limit(name: str, option: str, value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"task type {name!r}: {option} must be a whole number of at least 1")
    return value


# What every claim reads of a registry, computed once per set of types (Registry._current):
# its size when computed, the types, their concurrency limits, their rates, the claim-locked,
# their group bursts.
_Derived = tuple[
    int,
    list[str],
    dict[str, tuple[int | None, int | None]],
    dict[str, tuple[Rate | None, Rate | None]],
    list[str],
    dict[str, int],
]


SEQUENCE_ON_FAILURE = ("halt", "continue")


@dataclass(frozen=True)
class SharedLimit:
    """A limit several types share (Registry.limit): fleet-wide, counted over all of them."""

    name: str
    max_running: int | None = None
    max_running_per_group: int | None = None
    rate: Rate | None = None

    @property
    def key(self) -> str:
        """Its claim lock's key and its rate window's type: '@name' (never a type's name)."""
        return "@" + self.name


# One row per (type, shared limit it is under): the claim's and the discovery's arrays
# (slotd.repository.queue.limit_params), sorted by type.
SharedRow = tuple[str, str, int | None, int | None, int | None, float | None]


class Registry:
    """What this replica can run. A ceiling is required: it is the handler's deadline and,
    plus the margin, the lease and so the crash-recovery wait for the type."""

    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}
        # Where the application's tasks live, when it knows better than the environment
        # (slotd.contrib.django: the DATABASES entry its backend writes to).
        self.database_url: str | None = None
        self._schedules: dict[str, Schedule] = {}
        self._chain = Chain()
        self._runner_hooks: list[Callable[[], Any]] = []
        # What every claim reads, computed once per set of types: handlers are only ever
        # added (a name registers once), so the number of them says whether it is current.
        self._derived: _Derived = (-1, [], {}, {}, [], {})
        self._limits: dict[str, SharedLimit] = {}

    def limit(
        self,
        name: str,
        *,
        max_running: int | None = None,
        max_running_per_group: int | None = None,
        rate: Rate | None = None,
    ) -> SharedLimit:
        """A limit shared by every type whose handler names it (`limits=[name]`), fleet-wide
        and exact as a type's own: at most `max_running` of them under a live lease at once
        (`max_running_per_group`: of one group), at most N starts in any window (`rate`:
        (N, window)). Declare it before the handlers that use it."""
        validate_type_name(name)
        if name in self._limits:
            raise ValueError(f"limit {name!r} is already declared")
        shared = SharedLimit(
            name,
            _limit(f"limit {name}", "max_running", max_running),
            _limit(f"limit {name}", "max_running_per_group", max_running_per_group),
            _rate(f"limit {name}", "rate", rate),
        )
        if shared.max_running is None and shared.max_running_per_group is None and not rate:
            raise ValueError(f"limit {name!r}: give max_running, max_running_per_group or rate")
        self._limits[name] = shared
        return shared

    @property
    def shared_limits(self) -> dict[str, SharedLimit]:
        """The limits declared (shared: read it, do not change it)."""
        return self._limits

    def order_options(self) -> dict[str, Any]:
        """The options of who runs next (#39) as plain data, for the runner's hello to its
        slot, whose registry view claims and settles by them: the shared limits, and each
        handler's sequence_on_failure and limits."""
        return {
            "limits": {
                n: (lim.max_running, lim.max_running_per_group, lim.rate)
                for n, lim in self._limits.items()
            },
            "handlers": {
                name: {
                    "sequence_on_failure": h.sequence_on_failure,
                    "limits": h.shared_limits,
                    "fair": h.fair,
                    "group_burst": h.group_burst,
                }
                for name, h in self._handlers.items()
            },
        }

    @property
    def fair_types(self) -> list[str]:
        """The served types whose groups take turns (fair=True), sorted."""
        return [name for name in self.types if self._handlers[name].fair]

    @property
    def group_bursts(self) -> dict[str, int]:
        """The served types whose groups may burst above max_running_per_group, by how many
        (group_burst); read by every discovery, so computed once per set of types (shared:
        read it, do not change it)."""
        return self._current()[5]

    @property
    def sequences_go_on(self) -> list[str]:
        """The served types whose failed end lets their sequence go on
        (sequence_on_failure="continue"), sorted: what the lapse sweep needs to know."""
        return [n for n in self.types if self._handlers[n].sequence_on_failure == "continue"]

    @property
    def shared_rows(self) -> list[SharedRow]:
        """(type, limit, max_running, max_running_per_group, rate N, rate window s) for each
        served type under each shared limit it names."""
        rows = []
        for task_type in self.types:
            for name in self._handlers[task_type].shared_limits:
                lim = self._limits[name]
                rate_n = lim.rate[0] if lim.rate else None
                rate_s = lim.rate[1].total_seconds() if lim.rate else None
                rows.append(
                    (task_type, name, lim.max_running, lim.max_running_per_group, rate_n, rate_s)
                )
        return rows

    def register(
        self,
        name: str,
        fn: HandlerFn,
        *,
        ceiling: timedelta,
        max_attempts: int | None = None,
        backoff_base: timedelta | None = None,
        backoff_cap: timedelta | None = None,
        max_running: int | None = None,
        max_running_per_group: int | None = None,
        keep_result: timedelta | None = None,
        rate: Rate | None = None,
        rate_per_group: Rate | None = None,
        retry_on: type[BaseException] | tuple[type[BaseException], ...] | None = None,
        discard_on: type[BaseException] | tuple[type[BaseException], ...] | None = None,
        backoff: Backoff | None = None,
        keep_history: timedelta | None = None,
        payload: type[Any] | None = None,
        sequence_on_failure: str = "halt",
        limits: Sequence[str] = (),
        fair: bool = False,
        group_burst: int = 0,
    ) -> HandlerFn:
        """`max_attempts`, `backoff_base`, `backoff_cap` override the worker's settings for
        this type; the worker that claims a task stamps its threshold on the row.
        `max_running` / `max_running_per_group`: fleet-wide concurrency limits.
        `keep_result`: store each success's JSON return value this long (slotd.result).
        `keep_history`: a success stays answerable this long (slotd.result's state and
        attempts; its value only with keep_result).
        `rate` / `rate_per_group`: (N, window), at most N starts of the type (of the type
        and one group) in any window of that length, fleet-wide.
        `retry_on`: exception types that are retried (any other is discarded: a dead letter
        now); `discard_on`: exception types discarded at once (checked first);
        `backoff(attempt, exc) -> timedelta`: the delay before the next attempt after a
        failure (else the capped exponential backoff).
        `payload`: a dataclass, TypedDict or pydantic model; task.payload is one (see
        `handler`, which also returns a typed handle for enqueueing).
        `sequence_on_failure`: a task of a sequence that ends failed "halt"s its sequence
        until an operator resumes it (default), or lets it "continue" with the next.
        `limits`: names of limits declared by `limit()`, shared with other types.
        `fair`: the type's groups take turns for its slots, the group that started least
        recently first (within priorities), so one group's backlog cannot starve another.
        `group_burst`: with max_running_per_group, a group may run this many more while no
        other group of the type has a due task waiting (checked at each claim, under the
        limit's lock); the cap holds again as soon as one does."""
        validate_type_name(name)
        if name in self._handlers:
            raise ValueError(f"task type {name!r} is already registered")
        if not isinstance(ceiling, timedelta) or ceiling <= timedelta(0):
            raise ValueError(f"task type {name!r}: ceiling must be a positive timedelta")
        if not callable(fn):
            raise ValueError(f"task type {name!r}: handler must be callable")
        if max_attempts is not None:
            max_attempts = max_attempts_value(max_attempts, f"task type {name!r}: max_attempts")
        _positive(backoff_base, f"task type {name!r}: backoff_base")
        _positive(backoff_cap, f"task type {name!r}: backoff_cap")
        _positive(keep_result, f"task type {name!r}: keep_result")
        _positive(keep_history, f"task type {name!r}: keep_history")
        if backoff_base and backoff_cap and backoff_cap < backoff_base:
            raise ValueError(f"task type {name!r}: backoff_cap is shorter than backoff_base")
        model = None if payload is None else _payload_model(name, payload)
        shared = _shared(name, limits, self._limits)
        _burst(name, group_burst, max_running_per_group)
        if sequence_on_failure not in SEQUENCE_ON_FAILURE:
            raise ValueError(
                f"task type {name!r}: sequence_on_failure must be 'halt' or 'continue', got"
                f" {sequence_on_failure!r}"
            )
        self._handlers[name] = Handler(
            name,
            fn,
            ceiling,
            is_async(fn),
            max_attempts,
            backoff_base,
            backoff_cap,
            _limit(name, "max_running", max_running),
            _limit(name, "max_running_per_group", max_running_per_group),
            self._chain,
            keep_result,
            _rate(name, "rate", rate),
            _rate(name, "rate_per_group", rate_per_group),
            _exceptions(name, "retry_on", retry_on),
            _exceptions(name, "discard_on", discard_on) or (),
            _backoff(name, backoff),
            keep_history,
            payload_model=model,
            sequence_on_failure=sequence_on_failure,
            shared_limits=shared,
            fair=bool(fair),
            group_burst=group_burst,
        )
        return fn

    def middleware(self, fn: Middleware) -> Middleware:
        """Wrap every attempt: `fn(task, ctx, call_next)` returns what `call_next()` returned
        (or its own value), outermost first in registration order; exceptions pass through
        it. A plain def wraps every handler, an async def (`await call_next()`) the async
        handlers only; see slotd.middleware. Usable as a decorator."""
        self._chain.add(fn, is_async(fn))
        return fn

    def on_runner_start(self, fn: Callable[[], Any]) -> Callable[[], Any]:
        """Call `fn()` in every runner process as it starts, after the fork and before its
        first task (set up a tracer provider and its exporter here: threads and sockets
        made before a fork do not work in the child). One that raises stops the runner
        from starting; its slot logs it and tries again with backoff. Not called by the
        test modes, which run handlers in the test's own process."""
        if not callable(fn):
            raise ValueError(f"on_runner_start: {fn!r} is not callable")
        self._runner_hooks.append(fn)
        return fn

    def runner_started(self) -> None:
        """In a new runner (slotd.runner): the on_runner_start hooks, in their order."""
        for hook in self._runner_hooks:
            hook()

    @overload
    def handler(
        self,
        name: str,
        *,
        ceiling: timedelta,
        max_attempts: int | None = None,
        backoff_base: timedelta | None = None,
        backoff_cap: timedelta | None = None,
        max_running: int | None = None,
        max_running_per_group: int | None = None,
        keep_result: timedelta | None = None,
        rate: Rate | None = None,
        rate_per_group: Rate | None = None,
        retry_on: type[BaseException] | tuple[type[BaseException], ...] | None = None,
        discard_on: type[BaseException] | tuple[type[BaseException], ...] | None = None,
        backoff: Backoff | None = None,
        keep_history: timedelta | None = None,
        payload: None = None,
        sequence_on_failure: str = "halt",
        limits: Sequence[str] = (),
        fair: bool = False,
        group_burst: int = 0,
    ) -> Callable[[F], F]: ...

    @overload
    def handler(
        self,
        name: str,
        *,
        ceiling: timedelta,
        max_attempts: int | None = None,
        backoff_base: timedelta | None = None,
        backoff_cap: timedelta | None = None,
        max_running: int | None = None,
        max_running_per_group: int | None = None,
        keep_result: timedelta | None = None,
        rate: Rate | None = None,
        rate_per_group: Rate | None = None,
        retry_on: type[BaseException] | tuple[type[BaseException], ...] | None = None,
        discard_on: type[BaseException] | tuple[type[BaseException], ...] | None = None,
        backoff: Backoff | None = None,
        keep_history: timedelta | None = None,
        payload: type[P],
        sequence_on_failure: str = "halt",
        limits: Sequence[str] = (),
        fair: bool = False,
        group_burst: int = 0,
    ) -> Callable[[Callable[[Task[P], Context], Any]], TaskHandle[P]]: ...

    def handler(
        self,
        name: str,
        *,
        ceiling: timedelta,
        max_attempts: int | None = None,
        backoff_base: timedelta | None = None,
        backoff_cap: timedelta | None = None,
        max_running: int | None = None,
        max_running_per_group: int | None = None,
        keep_result: timedelta | None = None,
        rate: Rate | None = None,
        rate_per_group: Rate | None = None,
        retry_on: type[BaseException] | tuple[type[BaseException], ...] | None = None,
        discard_on: type[BaseException] | tuple[type[BaseException], ...] | None = None,
        backoff: Backoff | None = None,
        keep_history: timedelta | None = None,
        payload: type[Any] | None = None,
        sequence_on_failure: str = "halt",
        limits: Sequence[str] = (),
        fair: bool = False,
        group_burst: int = 0,
    ) -> Callable[[Any], Any]:
        """Register the decorated function (see `register`). Untyped, the function itself
        is returned; with `payload=Model`, a TaskHandle: still callable as the function,
        with `.enqueue(conn, Model(...), **options)` and friends (slotd.typed.handle)."""

        def decorate(fn: Any) -> Any:
            self.register(
                name,
                fn,
                ceiling=ceiling,
                max_attempts=max_attempts,
                backoff_base=backoff_base,
                backoff_cap=backoff_cap,
                max_running=max_running,
                max_running_per_group=max_running_per_group,
                keep_result=keep_result,
                rate=rate,
                rate_per_group=rate_per_group,
                retry_on=retry_on,
                discard_on=discard_on,
                backoff=backoff,
                keep_history=keep_history,
                payload=payload,
                sequence_on_failure=sequence_on_failure,
                limits=limits,
                fair=fair,
                group_burst=group_burst,
            )
            model = self._handlers[name].payload_model
            return fn if model is None else TaskHandle(name, fn, model)

        return decorate

    def schedule(
        self,
        name: str,
        *,
        task_type: str,
        cron: str | None = None,
        every: timedelta | None = None,
        payload: Mapping[str, Any] | None = None,
        timezone: str = "UTC",
        catch_up: str = "latest",
        overlap: str = "skip",
    ) -> Schedule:
        """Enqueue a `task_type` task at every fire time of `cron` (5 fields, evaluated in
        `timezone`) or `every` (a timedelta), once for the whole fleet. Declare the handler
        first: everything is checked here, and bad input raises ValueError now rather than
        at the first fire. See slotd.schedule for fire times, catch-up and overlap."""
        from slotd import schedule as schedules  # the cron library only if schedules are used

        if not isinstance(name, str) or not TYPE_NAME.match(name):
            raise ValueError(
                f"invalid schedule name {name!r}: the task type name rule applies (lower case "
                "letters, digits and _ . : -, starting with a letter, at most 128 characters)"
            )
        if name in self._schedules:
            raise ValueError(f"schedule {name!r} is already declared")
        if task_type not in self._handlers:
            raise ValueError(
                f"schedule {name!r}: task type {task_type!r} has no handler in this registry "
                "(declare the handler first)"
            )
        declared = schedules.build(
            name,
            task_type=task_type,
            cron=cron,
            every=every,
            payload=payload,
            timezone=timezone,
            catch_up=catch_up,
            overlap=overlap,
        )
        self._schedules[name] = declared
        return declared

    @property
    def schedules(self) -> list[Schedule]:
        return [self._schedules[name] for name in sorted(self._schedules)]

    def get(self, name: str) -> Handler | None:
        return self._handlers.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._handlers

    def __iter__(self) -> Iterator[Handler]:
        return iter(sorted(self._handlers.values(), key=lambda h: h.name))

    def __len__(self) -> int:
        return len(self._handlers)

    def _current(self) -> _Derived:
        derived = self._derived
        if derived[0] != len(self._handlers):
            handlers = [self._handlers[name] for name in sorted(self._handlers)]
            derived = self._derived = (
                len(handlers),
                [h.name for h in handlers],
                {h.name: (h.max_running, h.max_running_per_group) for h in handlers if h.limited},
                {h.name: (h.rate, h.rate_per_group) for h in handlers if h.rated},
                [h.name for h in handlers if h.limited or h.rated or h.shared_limits],
                {h.name: h.group_burst for h in handlers if h.group_burst},
            )
        return derived

    @property
    def types(self) -> list[str]:
        """The served types, sorted (shared: read it, do not change it)."""
        return self._current()[1]

    @property
    def ceilings_seconds(self) -> list[float]:
        return [self._handlers[name].ceiling.total_seconds() for name in self.types]

    def max_attempts(self, default: int) -> list[int]:
        """Each type's dead-letter threshold, in `types` order: what a claim stamps."""
        found = (self._handlers[name].max_attempts for name in self.types)
        return [default if value is None else value for value in found]

    @property
    def limits(self) -> list[tuple[int | None, float | None, float | None]]:
        return [self._handlers[name].limits() for name in self.types]

    @property
    def concurrency_limits(self) -> dict[str, tuple[int | None, int | None]]:
        """(max_running, max_running_per_group) of the limited types only (shared: read it,
        do not change it)."""
        return self._current()[2]

    @property
    def rates(self) -> dict[str, tuple[Rate | None, Rate | None]]:
        """(rate, rate_per_group) of the rated types only (shared: read it, do not change
        it)."""
        return self._current()[3]

    @property
    def claim_locked(self) -> list[str]:
        """The types whose claims take the limit lock (claim_lock): limited or rated, sorted
        (shared: read it, do not change it)."""
        return self._current()[4]


def _shared(name: str, limits: object, declared: dict[str, SharedLimit]) -> tuple[str, ...]:
    """A handler's `limits=`: names of limits declared already, each once."""
    if isinstance(limits, str) or not isinstance(limits, Sequence | tuple):
        raise ValueError(f"task type {name!r}: limits must be a list of limit names")
    unknown = [n for n in limits if n not in declared]
    if unknown:
        raise ValueError(
            f"task type {name!r}: limits {unknown!r} not declared: call registry.limit(name,"
            " ...) before the handlers that use it"
        )
    return tuple(dict.fromkeys(limits))


def _payload_model(name: str, model: object) -> PayloadModel[Any]:
    try:
        return PayloadModel(model)  # type: ignore[arg-type]
    except TypeError as exc:
        raise TypeError(f"task type {name!r}: {exc}") from None


def load_registry(spec: str) -> Registry:
    """Import `package.module:attr` and return the Registry it names."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"bad --app {spec!r}: write it as MODULE:ATTR")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"bad --app {spec!r}: cannot import {module_name}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - whatever the application's import raised
        # Its own line, not forty of click's and importlib's frames: the exception and
        # where in the application it was raised; the whole traceback is one import away.
        raise ConfigError(
            f"bad --app {spec!r}: importing {module_name} raised "
            f"{type(exc).__name__}: {_said(exc)} ({raised_at(exc, module_name)}; "
            f"`python -c 'import {module_name}'` shows the traceback)"
        ) from None
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
    # slotd's integrations (opentelemetry, when importable) load here, in the supervisor,
    # so the slots and runners forked from it have them already: imported lazily, each
    # runner would pay the import again (tens of ms), and again after every kill or recycle.
    integrations.tracing()
    return target


def _said(exc: BaseException) -> str:
    """The exception's own words, on one line (a SyntaxError's without its position)."""
    text = exc.msg if isinstance(exc, SyntaxError) else str(exc)
    return (text or "").strip().split("\n", 1)[0]


def raised_at(exc: BaseException, module_name: str) -> str:
    """Where an import failed, as `file, line N`: a SyntaxError's own position, else the
    innermost frame in the application's package (its top-level name), else the innermost
    frame outside Python's standard library and importlib's frozen modules."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{exc.filename}, line {exc.lineno}"
    frames = traceback.extract_tb(exc.__traceback__)
    package = _package_dir(module_name.split(".")[0])
    stdlib = sysconfig.get_paths()["stdlib"]
    for inside in (
        lambda f: package is not None and f.startswith(package),
        lambda f: not f.startswith(("<", stdlib)),
        lambda f: True,
    ):
        found = [frame for frame in frames if inside(frame.filename)]
        if found:
            return f"{found[-1].filename}, line {found[-1].lineno}"
    return "no frame"


def _package_dir(top: str) -> str | None:
    """The directory (or file) the application's top-level module comes from."""
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    origin = Path(spec.origin)
    return str(origin.parent if origin.name == "__init__.py" else origin)
