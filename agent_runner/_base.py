"""Shared pydantic base classes of the core (ids and the clock live in `agent_runner.ids`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Self, TypeVar

from pydantic import BaseModel, ConfigDict

_set = object.__setattr__


ModelT = TypeVar("ModelT", bound=BaseModel)


def trusted(cls: type[ModelT], given: frozenset[str], values: dict[str, Any]) -> ModelT:
    """Build a model from values the runner made from validated data, without validating them again.

    What `model_construct` does for a model without aliases, extra fields or private
    attributes, minus its generic walk over the fields: `values` must hold every field
    (defaults included) and `given` names the fields that count as set.
    """
    built = cls.__new__(cls)
    _set(built, "__dict__", values)
    _set(built, "__pydantic_fields_set__", set(given))
    _set(built, "__pydantic_extra__", None)
    _set(built, "__pydantic_private__", None)
    return built


class FrozenModel(BaseModel):
    """Immutable pydantic model that rejects unknown fields.

    Change a value with `model_copy(update=...)`, which returns a new object.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True, serialize_by_alias=True)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """Return a shallow copy with `update` applied (not validated), as `BaseModel.model_copy` does.

        The runner copies a snapshot several times per step. These models forbid extra
        fields and have no private attributes, so the copy is their field values and the
        set of fields given, without the generic path's `copy.copy` of each part.
        """
        if deep or self.__pydantic_private__ is not None:
            return super().model_copy(update=update, deep=deep)
        cls = type(self)
        copied = cls.__new__(cls)
        values = self.__dict__.copy()
        fields_set = set(self.__pydantic_fields_set__)
        if update:
            values.update(update)
            fields_set.update(update)
        _set(copied, "__dict__", values)
        _set(copied, "__pydantic_fields_set__", fields_set)
        _set(copied, "__pydantic_extra__", None)
        _set(copied, "__pydantic_private__", None)
        return copied


class PositionalModel(FrozenModel):
    """A frozen model whose leading fields may also be passed positionally.

    `UserMessage("hi")` and `UserMessage(content="hi")` build the same message.
    """

    _positional: ClassVar[tuple[str, ...]] = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if args:
            names = self._positional
            if len(args) > len(names):
                raise TypeError(
                    f"{type(self).__name__} takes at most {len(names)} positional arguments ({len(args)} given)"
                )
            for name, value in zip(names, args, strict=False):
                if name in kwargs:
                    raise TypeError(f"{type(self).__name__} got multiple values for argument {name!r}")
                kwargs[name] = value
        super().__init__(**kwargs)

    # Validation of nested data (loading a snapshot with thousands of messages) passes
    # fields by name, so pydantic may skip this Python-level __init__ there, as it does for
    # BaseModel's own: it is only needed when a program constructs a model positionally.
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]
