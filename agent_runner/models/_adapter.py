"""What every provider adapter shares, without any provider's SDK.

Failure sorting (which HTTP statuses a later call may not hit again), tool-call arguments that are not a JSON object kept for the model to correct,
text made storable, and prices.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, Callable, Collection, Iterable, Mapping
from decimal import Decimal
from typing import Any, ClassVar, Final, Literal, NoReturn, Self, TypeVar

from agent_runner.errors import AgentRunnerError, DefinitionError, InputLimitError, RecoverableError
from agent_runner.ids import new_id
from agent_runner.limits import (
    DEFAULT_LIMITS,
    InputLimits,
    bounded_text,
    check_reference,
    check_tool_arguments,
    preview,
    storable_text,
)
from agent_runner.messages import ToolCall
from agent_runner.models import ChatRequest, ChatResponse, ProviderChatModel
from agent_runner.policy import parse_retry_after
from agent_runner.tools import INVALID_ARGUMENTS_KEY
from agent_runner.usage import Usage

DEFAULT_TIMEOUT: Final = 120.0
"""Seconds to wait for a response (or, when streaming, between two chunks)."""

CONNECT_TIMEOUT: Final = 10.0
_RETRYABLE_STATUS: Final = frozenset({408, 409, 429})
_DETAIL_LIMIT: Final = 500
T = TypeVar("T")


class ModelAPIError(AgentRunnerError):
    """The model API rejected the request in a way that repeating it will not fix.

    Raised for 400, 401, 403, 404, 422 and other non-retryable statuses, for an error
    reported inside a stream that is not transient, and for a response the adapter cannot
    read. The runner fails the turn instead of scheduling a retry.

    Args:
        status_code: The HTTP status, or None when the failure had none (stream error, bad body).
        message: What went wrong, without credentials.
    """

    def __init__(self, status_code: int | None, message: str) -> None:
        self.status_code = status_code
        super().__init__(message)


def status_failure(status: int, message: str, headers: Mapping[str, str]) -> AgentRunnerError:
    """Sort an HTTP error status: 408, 409, 429 and 5xx (Anthropic's 529 too) may pass, others will not.

    A retryable status becomes `RecoverableError` carrying the server's Retry-After.
    """
    if status in _RETRYABLE_STATUS or status >= 500:
        return RecoverableError(message, retry_after=parse_retry_after(headers), rate_limited=status == 429)
    return ModelAPIError(status, message)


def parse_tool_arguments(text: str, limits: InputLimits = DEFAULT_LIMITS) -> dict[str, Any]:
    """Parse a model's tool-call arguments, never raising.

    Empty text means no arguments. Text that is not a JSON object, or one over `limits`
    (bigger than `max_tool_arguments_bytes`, nested deeper than `max_json_depth`, or holding
    text that cannot be stored), becomes `{INVALID_ARGUMENTS_KEY: {"raw": text, "error": reason}}`;
    `raw` keeps only the start of arguments over the size limit.
    """
    if not text.strip():
        return {}
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > limits.max_tool_arguments_bytes:
        reason = f"{size} bytes, over the limit of {limits.max_tool_arguments_bytes} bytes"
        return _invalid_arguments(preview(text), reason)
    try:
        # NaN and Infinity are not JSON, and PostgreSQL refuses them in a JSON column.
        value = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        return _invalid_arguments(text, f"nested more than {limits.max_json_depth} levels deep")
    except ValueError as exc:
        return _invalid_arguments(text, f"not valid JSON: {exc}")
    if not isinstance(value, dict):
        return _invalid_arguments(text, f"a JSON object was expected, got {type(value).__name__}")
    try:
        check_tool_arguments(limits, value, "arguments")
    except InputLimitError as exc:
        return _invalid_arguments(text, str(exc))
    return value


def _invalid_arguments(raw: str, error: str) -> dict[str, Any]:
    # The raw text goes into the snapshot: a NUL or lone surrogate there would fail the save.
    return {INVALID_ARGUMENTS_KEY: {"raw": storable_text(raw), "error": error}}


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def model_tool_call(call_id: str | None, name: str, arguments: str, limits: InputLimits) -> ToolCall:
    """A tool call as a model wrote it, made storable; arguments that are not a JSON object are kept marked."""
    # Some servers omit call ids; the runner needs one to pair the ToolMessage. An id that
    # could not be stored is replaced too: the runner writes the result, so any id pairs.
    try:
        call_id = check_reference(call_id, "id", limits) if call_id else None
    except InputLimitError:
        call_id = None
    if len(name) > limits.max_id_length or storable_text(name) != name:
        # No tool has such a name: keep a bounded, storable one for the "unknown tool" answer.
        name = preview(name, limits.max_id_length)
    return ToolCall(id=call_id or f"call_{new_id()}", name=name, arguments=parse_tool_arguments(arguments, limits))


def joined_by_role(entries: Iterable[tuple[str, list[dict[str, Any]]]], field: str) -> list[dict[str, Any]]:
    """`(role, items)` pairs as the API's turns: consecutive items of one role join one turn under `field`.

    APIs that want the roles to alternate (Anthropic's Messages, Gemini's contents) refuse two
    turns of one role in a row, which a tool result after a user message would otherwise make.
    Pairs without items are left out.
    """
    turns: list[dict[str, Any]] = []
    for role, items in entries:
        if not items:
            continue
        if turns and turns[-1]["role"] == role:
            turns[-1][field].extend(items)
        else:
            turns.append({"role": role, field: items})
    return turns


def sent_arguments(call: ToolCall) -> str:
    """A call's arguments as JSON text, also for a call kept under `INVALID_ARGUMENTS_KEY`.

    Always valid JSON: several servers parse the arguments sent back and answer 400 otherwise.
    """
    return json.dumps(call.arguments, ensure_ascii=False)


def model_text(content: str | None, limits: InputLimits) -> str | None:
    """A model's text made storable and cut to `max_message_bytes`."""
    if content is None:
        return None
    return bounded_text(storable_text(content), limits.max_message_bytes)


def short_detail(detail: str) -> str:
    """One line of at most 500 characters, for an error message."""
    detail = " ".join(detail.split())
    return detail if len(detail) <= _DETAIL_LIMIT else detail[: _DETAIL_LIMIT - 3] + "..."


def redact(text: str, key: str | None) -> str:
    """`text` with the API key replaced by `***`.

    Some proxies echo the key they rejected; error messages end up in snapshots and logs.
    """
    if key and len(key) >= 4:
        text = text.replace(key, "***")
    return text


def check_price(price: tuple[float, float] | None) -> None:
    """Refuse a `price=` that is not `(input, output)` per million tokens.

    Raises:
        DefinitionError: A price of another shape, or a negative one.
    """
    if price is not None and (len(price) != 2 or min(price) < 0):
        raise DefinitionError(f"price must be (input, output) per million tokens, both >= 0, got {price!r}")


def priced(usage: Usage, price: tuple[float, float] | None, provider: str, model: str) -> Usage:
    """`usage` with its cost: from `price` when given, else from the `genai-prices` list.

    Cached tokens are priced as the provider bills them when the list knows the model. A
    model the list does not know (or the `prices` extra not installed) costs 0.0.
    """
    if price is not None:
        cost = (usage.input_tokens * price[0] + usage.output_tokens * price[1]) / 1_000_000
        return usage.model_copy(update={"cost": cost})
    if not (usage.input_tokens or usage.output_tokens):
        return usage
    try:
        from genai_prices import Usage as PriceUsage
        from genai_prices import calc_price
        from genai_prices.data_snapshot import get_snapshot
    except ImportError:
        return usage
    snapshot = get_snapshot()
    known = _RATES.get((provider, model))
    if known is not None and known[0] is snapshot:
        rates = known[1]
    else:
        try:
            rates = _flat_rates(snapshot, provider, model)
        except LookupError:
            rates = False
        _RATES[(provider, model)] = (snapshot, rates)
    if rates is False:
        return usage
    if rates is not None and (rates[1] is None or max(usage.input_tokens, usage.output_tokens) < rates[1]):
        uncached = usage.input_tokens - usage.cache_read_tokens - usage.cache_write_tokens
        counts = (uncached, usage.cache_read_tokens, usage.cache_write_tokens, usage.output_tokens)
        total = sum((rate * count for rate, count in zip(rates[0], counts, strict=True)), Decimal(0))
        return usage.model_copy(update={"cost": float(total)})
    counted = PriceUsage(
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        cache_read_tokens=usage.cache_read_tokens or None,
        cache_write_tokens=usage.cache_write_tokens or None,
    )
    return usage.model_copy(update={"cost": float(calc_price(counted, model, provider_id=provider).total_price)})


def _flat_rates(snapshot: Any, provider: str, model: str) -> _Rates | None:
    """The price per token of uncached input, cache reads, cache writes and output, and the count they hold below.

    Below the first tier of a model priced by tiers (None: no tiers) the price is one rate per
    kind of token, read from the list's own calculation once: that calculation costs more than
    the call's other bookkeeping. None for a model priced by date, whose rate changes.

    Raises:
        LookupError: The list does not know the model.
    """
    from genai_prices import Usage as PriceUsage
    from genai_prices.types import ModelPrice, TieredPrices

    # Variants apply only to a request context, which these calls never give.
    _, info = snapshot.find_provider_model(model, None, provider, None)
    prices = info.prices
    if not isinstance(prices, ModelPrice):
        return None
    starts = [tier.start for value in vars(prices).values() if isinstance(value, TieredPrices) for tier in value.tiers]
    below = min(starts, default=None)
    sample = 1000 if below is None else min(1000, below // 4)
    if sample < 1:
        return None
    basis = (
        PriceUsage(input_tokens=sample),
        PriceUsage(input_tokens=sample, cache_read_tokens=sample),
        PriceUsage(input_tokens=sample, cache_write_tokens=sample),
        PriceUsage(output_tokens=sample),
    )
    return tuple(Decimal(prices.calc_price(counted)["total_price"]) / sample for counted in basis), below


_Rates = tuple[tuple[Decimal, ...], int | None]
_RATES: dict[tuple[str, str], tuple[object, _Rates | None | Literal[False]]] = {}
"""(provider, model) -> (the price list read, the model's rates; None: priced by date; False: not listed).

Kept for as long as that list is read: a model the list does not know (a local model, say)
costs 0.0 without a search.
"""


def timeouts(timeout: float | None) -> tuple[float, float]:
    """The read and connect timeouts of a client built by an adapter: `timeout` (default 120 s), connecting at most 10 s."""
    read = DEFAULT_TIMEOUT if timeout is None else timeout
    return read, min(read, CONNECT_TIMEOUT)


def refuse_with_client(owner: str, given: Mapping[str, object]) -> None:
    """Refuse client options given beside a ready client: they would be silently ignored.

    Raises:
        DefinitionError: Any value of `given` is not None.
    """
    names = [name for name, value in given.items() if value is not None]
    if names:
        raise DefinitionError(f"{owner} got a client and {names}; configure the client instead")


def check_settings(
    owner: str, settings: Mapping[str, Any], reserved: Collection[str], known: Collection[str] | None, hint: str
) -> None:
    """Refuse settings the adapter fills itself, and (when `known` is given) names the SDK call does not take.

    Caught at construction rather than as a TypeError in the middle of a turn, which would fail it.

    Raises:
        DefinitionError: A reserved or unknown setting; `hint` says where unknown ones go.
    """
    taken = sorted(set(reserved) & settings.keys())
    if taken:
        raise DefinitionError(f"{owner} sets {taken} itself; they cannot be given as settings")
    unknown = sorted(set(settings) - set(known) - {"self"}) if known is not None else []
    if unknown:
        raise DefinitionError(f"{owner} got unknown settings {unknown}; {hint}")


def relay_stream(
    chunks: Iterable[T],
    read: Callable[[T], str | None],
    on_delta: Callable[[str], None] | None,
    failure: Callable[[Exception], Exception | None],
) -> None:
    """Read every chunk of a stream with `read`, passing each text delta it returns to `on_delta`.

    Only reading is guarded: an error raised by `on_delta` belongs to the caller and reaches
    it unchanged. An error of reading goes through `failure`, which returns what to raise
    instead (None: raise it as it is).
    """
    iterator = iter(chunks)
    while True:
        try:
            text = read(next(iterator))
        except StopIteration:
            return
        except Exception as exc:
            raise_translated(exc, failure)
        if text and on_delta is not None:
            on_delta(text)


async def arelay_stream(
    chunks: AsyncIterable[T],
    read: Callable[[T], str | None],
    on_delta: Callable[[str], None] | None,
    failure: Callable[[Exception], Exception | None],
) -> None:
    """`relay_stream` for a stream read on an event loop."""
    iterator = aiter(chunks)
    while True:
        try:
            text = read(await anext(iterator))
        except StopAsyncIteration:
            return
        except Exception as exc:
            raise_translated(exc, failure)
        if text and on_delta is not None:
            on_delta(text)


def raise_translated(exc: Exception, failure: Callable[[Exception], Exception | None]) -> NoReturn:
    """Raise what `failure` makes of `exc` (chained to it), or `exc` itself when it makes nothing."""
    translated = failure(exc)
    if translated is None:
        raise exc
    raise translated from exc


class SdkChatModel(ProviderChatModel):
    """A provider adapter over an SDK client it may have built (then `close()` closes it) or was given."""

    _client: Any
    _owns_client: bool = False
    _async_client: Any = None
    _owns_async_client: bool = False
    _base_url: str
    _reserved_settings: ClassVar[Collection[str]] = ()
    """Settings the adapter fills itself, refused when given."""
    _settings_hint: ClassVar[str] = "pass fields the SDK does not know in extra_body={...}"
    """Where settings the SDK call does not take belong instead."""
    model: str
    stream: bool
    price: tuple[float, float] | None
    limits: InputLimits

    def _init_adapter(
        self,
        model: str,
        stream: bool,
        price: tuple[float, float] | None,
        rate_limit_key: str | None,
        limits: InputLimits | None,
        settings: Mapping[str, Any],
        known_settings: Collection[str] | None,
    ) -> None:
        """Check the arguments every adapter takes (see `check_settings`, `check_price`) and keep them."""
        check_settings(type(self).__name__, settings, self._reserved_settings, known_settings, self._settings_hint)
        check_price(price)
        self._init_rate_limit_key(model, rate_limit_key)
        self.model = model
        self.stream = stream
        self.price = price
        self.limits = limits if limits is not None else DEFAULT_LIMITS

    def _use_clients(self, client: Any, owned: bool, async_client: Any = None, max_retries: int = 0) -> None:
        """Keep the SDK client (`owned`: built here, so `close()` closes it) and the async client given, if any.

        The async client given gets the same SDK-level retries as the sync one.
        """
        self._client = client
        self._owns_client = owned
        self._async_client = async_client.with_options(max_retries=max_retries) if async_client is not None else None
        self._base_url = str(client.base_url)

    def close(self) -> None:
        """Close the HTTP connections of the client built here (an injected client is left open)."""
        if self._owns_client:
            self._client.close()

    async def aclose(self) -> None:
        """Close the async client built here for `agenerate`, and the sync one (`close()`)."""
        if self._async_client is not None and self._owns_async_client:
            await self._async_client.close()
        self.close()

    def _async_twin(self, client_class: Callable[..., Any]) -> Any:
        """The async client for `agenerate`: the one given, or one built like the sync client (same key, URL, timeouts)."""
        if self._async_client is None:
            self._async_client = client_class(
                api_key=self._client.api_key,
                base_url=self._client.base_url,
                max_retries=self._client.max_retries,
                timeout=self._client.timeout,
            )
            self._owns_async_client = True
        return self._async_client

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def stream_cut(where: str) -> RecoverableError:
    """A stream that ended before its final event.

    A connection closed early can look like a normal end of the body; saving the partial
    answer as final would be wrong, and asking again usually succeeds.
    """
    return RecoverableError(f"{where} ended the stream before finishing")


class OneCallChatModel(SdkChatModel):
    """An adapter whose answer comes from one SDK call, whole or as a stream of events, sync or async.

    A subclass says how to make the call (`_create`), read a whole answer (`_read_answer`),
    read a stream (`_stream_reader`), sort a failure (`_reading_failure`) and get its async
    client (`_async`); `generate` and `agenerate` are the same steps around them.
    """

    def request_arguments(self, request: ChatRequest) -> dict[str, Any]:
        """The keyword arguments of the SDK call for `request`."""
        raise NotImplementedError

    def _create(self, client: Any, arguments: dict[str, Any], stream: bool) -> Any:
        raise NotImplementedError

    def _read_answer(self, answer: Any) -> ChatResponse:
        raise NotImplementedError

    def _stream_reader(self) -> tuple[Callable[[Any], str | None], Callable[[], ChatResponse]]:
        """A function taking each event (returning its text delta) and one giving the answer at the end."""
        raise NotImplementedError

    def _reading_failure(self, exc: Exception) -> Exception | None:
        raise NotImplementedError

    def _async(self) -> Any:
        raise NotImplementedError

    def generate(self, request: ChatRequest) -> ChatResponse:
        """Call the model once and return its message and usage.

        Raises:
            RecoverableError: Timeout, connection failure, 408, 409, 429, 5xx (529 too), or a
                transient failure reported in the answer; `retry_after` carries the server's delay.
            ModelAPIError: Any other failure of the API, or an answer that cannot be read.
        """
        arguments = self.request_arguments(request)
        try:
            answer = self._create(self._client, arguments, self.stream)
            if not self.stream:
                return self._read_answer(answer)
        except Exception as exc:
            raise_translated(exc, self._reading_failure)
        read, finish = self._stream_reader()
        with answer:
            relay_stream(answer, read, request.on_delta, self._reading_failure)
        return finish()

    async def agenerate(self, request: ChatRequest) -> ChatResponse:
        """`generate` on the SDK's async client, for callers on an event loop.

        The async client is the one given, or one built on first use like the sync client
        (same key, URL and timeouts); `aclose()` closes it.
        """
        arguments = self.request_arguments(request)
        try:
            answer = await self._create(self._async(), arguments, self.stream)
            if not self.stream:
                return self._read_answer(answer)
        except Exception as exc:
            raise_translated(exc, self._reading_failure)
        read, finish = self._stream_reader()
        async with answer:
            await arelay_stream(answer, read, request.on_delta, self._reading_failure)
        return finish()
