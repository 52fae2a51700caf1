"""Token and cost accounting."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from pydantic import Field

from agent_runner._base import PositionalModel, trusted


def _zero(count: int) -> bool:
    return count == 0


class Usage(PositionalModel):
    """Tokens and cost of one model call, or the running total of a turn.

    `input_tokens` counts every input token, those read from or written to a provider's
    prompt cache included; `output_tokens` counts every output token, reasoning included.
    The cache and reasoning counts say how many of them were of that kind.
    """

    _positional: ClassVar[tuple[str, ...]] = ("input_tokens", "output_tokens", "cost")

    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0
    # The detail counts are left out of the JSON while zero, so usage of models that
    # report none serializes as before.
    cache_read_tokens: int = Field(default=0, exclude_if=_zero)
    """Input tokens read from the provider's prompt cache (billed at a discount)."""
    cache_write_tokens: int = Field(default=0, exclude_if=_zero)
    """Input tokens written to the provider's prompt cache (Anthropic bills them at a premium)."""
    reasoning_tokens: int = Field(default=0, exclude_if=_zero)
    """Output tokens the model spent reasoning before it answered."""

    if TYPE_CHECKING:

        def __init__(
            self,
            input_tokens: int = 0,
            output_tokens: int = 0,
            cost: float = 0.0,
            *,
            cache_read_tokens: int = 0,
            cache_write_tokens: int = 0,
            reasoning_tokens: int = 0,
        ) -> None: ...

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
                "cache_read_tokens": self.cache_read_tokens + other.cache_read_tokens,
                "cache_write_tokens": self.cache_write_tokens + other.cache_write_tokens,
                "reasoning_tokens": self.reasoning_tokens + other.reasoning_tokens,
            },
        )


_ALL_FIELDS = frozenset(Usage.model_fields)
