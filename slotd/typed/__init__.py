"""Typed tasks: payload models (a dataclass, TypedDict or pydantic model, `models`), the
handle `@registry.handler(..., payload=Model)` returns (`handle`), and the id an enqueue
returns (`ids`: an int that says whether the enqueue created the row)."""

from slotd.typed.handle import TaskHandle
from slotd.typed.ids import EnqueuedId
from slotd.typed.models import PayloadModel

__all__ = ["EnqueuedId", "PayloadModel", "TaskHandle"]
