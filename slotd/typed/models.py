"""Typed payloads: a dataclass, a TypedDict or a pydantic model as a task type's payload.

The wire format stays a JSON object. `PayloadModel.dump` turns a model instance into that
object (validated first, in the producer's frame: nothing is written when it fails) and
`load` turns a claimed task's JSON back into the model (a failure there is the task's
dead letter, reason "discarded": the same payload would fail every attempt).

pydantic is never imported here: a pydantic model's class can only exist when its user
imported pydantic, so it is recognised through sys.modules. Dataclasses and TypedDicts are
checked against their annotations by `_convert`, which knows the JSON types only (str, int,
float, bool, None, list, dict with str keys, unions, Literal, nested dataclasses and
TypedDicts); any other field type is refused when the handler is declared, with a pointer
to pydantic, which knows the rest (datetimes, UUIDs, constraints)."""

from __future__ import annotations

import dataclasses
import sys
import types
import typing
from collections.abc import Mapping
from typing import Any, Generic, Literal, TypeVar, Union, get_args, get_origin

P = TypeVar("P")

_SCALARS = (str, int, float, bool)


def _pydantic_model(model: object) -> bool:
    pydantic = sys.modules.get("pydantic")
    base = getattr(pydantic, "BaseModel", None)
    return base is not None and isinstance(model, type) and issubclass(model, base)


def _is_typeddict(model: object) -> bool:
    return typing.is_typeddict(model)


def _is_dataclass(model: object) -> bool:
    return isinstance(model, type) and dataclasses.is_dataclass(model)


def _name(tp: object) -> str:
    return getattr(tp, "__name__", None) or repr(tp)


def _hints(model: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(model)
    except Exception as exc:  # noqa: BLE001 - a NameError or worse, named for the user
        raise TypeError(
            f"payload model {_name(model)}: cannot resolve its annotations: {exc}"
        ) from None


def _where(path: str) -> str:
    return f"field {path!r}" if path else "payload"


def _supported(tp: Any, path: str, seen: set[int]) -> None:
    """Refuse, at declaration, a field type the JSON checks below do not know."""
    origin = get_origin(tp)
    if tp is Any or tp is None or tp is type(None) or tp in _SCALARS:
        return
    if origin in (Union, types.UnionType) or origin in (list, dict):
        if origin is dict and get_args(tp) and get_args(tp)[0] is not str:
            raise TypeError(f"{_where(path)}: a dict payload field needs str keys (JSON)")
        for arg in get_args(tp):
            _supported(arg, path, seen)
        return
    if origin is Literal:
        return
    if tp in (list, dict):
        return
    if _is_dataclass(tp) or _is_typeddict(tp):
        if id(tp) in seen:
            return
        seen.add(id(tp))
        for name, hint in _hints(tp).items():
            _supported(hint, f"{path}.{name}" if path else name, seen)
        return
    raise TypeError(
        f"{_where(path)}: type {_name(tp)} is not a JSON type (str, int, float, bool, None,"
        " list, dict, a dataclass or TypedDict of them); use a pydantic model for others"
    )


def _convert(value: Any, tp: Any, path: str, loading: bool) -> Any:
    """`value` checked against `tp` and converted towards JSON (dumping) or towards the
    model (loading: nested dataclasses built). TypeError/ValueError naming the field."""
    origin = get_origin(tp)
    if tp is Any:
        return value
    if tp is None or tp is type(None):
        if value is not None:
            raise TypeError(f"{_where(path)}: expected null, got {type(value).__name__}")
        return None
    if origin in (Union, types.UnionType):
        for arm in get_args(tp):
            try:
                return _convert(value, arm, path, loading)
            except (TypeError, ValueError):
                continue
        raise TypeError(f"{_where(path)}: {_describe(value)} matches none of {_name_of(tp)}")
    if origin is Literal:
        if not any(value == a and type(value) is type(a) for a in get_args(tp)):
            raise ValueError(f"{_where(path)}: {value!r} is not one of {list(get_args(tp))}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise TypeError(f"{_where(path)}: expected a boolean, got {_describe(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{_where(path)}: expected an integer, got {_describe(value)}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"{_where(path)}: expected a number, got {_describe(value)}")
        return float(value) if loading else value
    if tp is str:
        if not isinstance(value, str):
            raise TypeError(f"{_where(path)}: expected a string, got {_describe(value)}")
        return value
    if tp is list or origin is list:
        if not isinstance(value, list | tuple) or (loading and not isinstance(value, list)):
            raise TypeError(f"{_where(path)}: expected a list, got {_describe(value)}")
        (item,) = get_args(tp) or (Any,)
        return [_convert(v, item, f"{path}[{i}]", loading) for i, v in enumerate(value)]
    if tp is dict or origin is dict:
        if not isinstance(value, Mapping):
            raise TypeError(f"{_where(path)}: expected an object, got {_describe(value)}")
        _, item = get_args(tp) or (str, Any)
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"{_where(path)}: key {k!r} is not a string")
            out[k] = _convert(v, item, f"{path}.{k}" if path else k, loading)
        return out
    if _is_dataclass(tp):
        return _dataclass(value, tp, path, loading)
    if _is_typeddict(tp):
        return _typeddict(value, tp, path, loading)
    raise TypeError(f"{_where(path)}: type {_name(tp)} is not supported")


def _describe(value: Any) -> str:
    return "null" if value is None else f"{type(value).__name__} {value!r}"[:80]


def _name_of(tp: Any) -> str:
    return " | ".join(_name(a) if a is not type(None) else "None" for a in get_args(tp))


def _fields(data: Mapping[str, Any], model: type, path: str, required: set[str]) -> None:
    known = _hints(model)
    for name in data:
        if name not in known:
            raise ValueError(f"{_where(_join(path, str(name)))}: unknown to {_name(model)}")
    for name in sorted(required):
        if name not in data:
            raise ValueError(f"{_where(_join(path, name))}: missing (required by {_name(model)})")


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _dataclass(value: Any, model: type, path: str, loading: bool) -> Any:
    hints = _hints(model)
    if not loading:
        if not isinstance(value, model):
            raise TypeError(f"{_where(path)}: expected a {_name(model)}, got {_describe(value)}")
        return {
            f.name: _convert(getattr(value, f.name), hints[f.name], _join(path, f.name), False)
            for f in dataclasses.fields(model)
            if f.init
        }
    if not isinstance(value, Mapping):
        raise TypeError(f"{_where(path)}: expected an object, got {_describe(value)}")
    fields = [f for f in dataclasses.fields(model) if f.init]
    required = {
        f.name
        for f in fields
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    _fields(value, model, path, required)
    kwargs = {n: _convert(v, hints[n], _join(path, n), True) for n, v in value.items()}
    return model(**kwargs)


def _typeddict(value: Any, model: type, path: str, loading: bool) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise TypeError(
            f"{_where(path)}: expected a {_name(model)} (a dict), got {_describe(value)}"
        )
    hints = _hints(model)
    _fields(value, model, path, set(getattr(model, "__required_keys__", ())))
    return {n: _convert(v, hints[n], _join(path, n), loading) for n, v in value.items()}


class PayloadModel(Generic[P]):
    """How one model class goes to and from the JSON object a task carries."""

    def __init__(self, model: type[P]) -> None:
        self.model = model
        self.pydantic = _pydantic_model(model)
        if not self.pydantic:
            if not (_is_dataclass(model) or _is_typeddict(model)):
                raise TypeError(
                    f"payload={model!r}: use a dataclass, a TypedDict or a pydantic model"
                )
            _supported(model, "", set())
        self.name = _name(model)

    def dump(self, value: P, what: str) -> dict[str, Any]:
        """The JSON object for `value`, validated: TypeError/ValueError naming `what`
        and the field."""
        try:
            if self.pydantic:
                if not isinstance(value, self.model):
                    raise TypeError(f"payload: expected a {self.name}, got {_describe(value)}")
                data = value.model_dump(mode="json")  # type: ignore[attr-defined]
                self.model.model_validate(data)  # type: ignore[attr-defined]
                return data
            return _convert(value, self.model, "", False)
        except (TypeError, ValueError) as exc:
            raise _named(exc, what) from None

    def load(self, data: Any, what: str) -> P:
        """The model for a claimed task's JSON object, validated."""
        try:
            if self.pydantic:
                return self.model.model_validate(data)  # type: ignore[attr-defined, no-any-return]
            return _convert(data, self.model, "", True)  # type: ignore[no-any-return]
        except (TypeError, ValueError) as exc:
            raise _named(exc, what) from None


def _named(exc: Exception, what: str) -> Exception:
    """The error with `what` in front; a pydantic ValidationError (a ValueError) as its
    first error's field and message, one line."""
    errors = getattr(exc, "errors", None)
    if callable(errors) and type(exc).__name__ == "ValidationError":
        first = errors()[0]
        field = ".".join(str(p) for p in first.get("loc", ())) or "payload"
        count = len(errors())
        more = f" (and {count - 1} more)" if count > 1 else ""
        return ValueError(f"{what}: field {field!r}: {first.get('msg')}{more}")
    return type(exc)(f"{what}: {exc}")
