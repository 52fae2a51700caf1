"""Token and cost accounting."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from agent_runner._base import PositionalModel, trusted


class Usage(PositionalModel):
    """Tokens and cost of one model call, or the running total of a turn."""

    _positional: ClassVar[tuple[str, ...]] = ("input_tokens", "output_tokens", "cost")

    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0

    if TYPE_CHECKING:

        def __init__(self, input_tokens: int = 0, output_tokens: int = 0, cost: float = 0.0) -> None: ...

    @property
    def total_tokens(self) -> int:
        """Input plus output tokens."""
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Usage) -> Usage:
        # Sums of validated counts and costs are valid: no need to validate them again.
        return trusted(
            Usage,
            _ALL_FIELDS,
            {
                "input_tokens": self.input_tokens + other.input_tokens,
                "output_tokens": self.output_tokens + other.output_tokens,
                "cost": self.cost + other.cost,
            },
        )


_ALL_FIELDS = frozenset(Usage.model_fields)
