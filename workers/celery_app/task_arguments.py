"""The check every Celery task runs on its arguments before it does anything.

Anyone who can write to the broker can send a task message, and a message may be
corrupted or come from an older or newer producer. A delivery whose arguments do not fit
the task's signature (too many or too few, an unknown keyword, a wrong type, an id that
breaks the id rules) is rejected: the task logs one warning line, without a traceback and
without the values themselves, and returns its `rejected` outcome, so the message is
acknowledged and never retried.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from typing import Any, NewType, TypeVar

from agent_runner import InputLimitError
from agent_runner.limits import ConversationId, check_conversation_id, check_id, check_tenant_id, preview

logger = logging.getLogger("workers.tasks")

T = TypeVar("T")


def checked_arguments(task_name: str, rejected: T) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Make a task function reject deliveries whose arguments do not fit its signature.

    Parameters annotated `str` are ids and must follow the id rules (`check_id`);
    parameters annotated `ConversationId` are conversation ids (`check_conversation_id`);
    parameters annotated `TenantId | None` are tenant names (`check_tenant_id`) or None;
    parameters annotated `int` must be integers (not
    booleans). The wrapped function keeps
    its name and signature for Celery and for readers.

    Args:
        task_name: The task's registered name, shown in the warning.
        rejected: What the task returns for a rejected delivery.
    """

    def wrap(function: Callable[..., T]) -> Callable[..., T]:
        signature = inspect.signature(function, eval_str=True)

        @functools.wraps(function)
        def entry(*args: Any, **kwargs: Any) -> T:
            problem = _problem(signature, args, kwargs)
            if problem is not None:
                # A preview only: a forged message's values are never echoed in full.
                logger.warning("rejected a %s message: %s; it is dropped, not retried", task_name, preview(problem))
                return rejected
            return function(*args, **kwargs)

        return entry

    return wrap


TenantId = NewType("TenantId", str)
"""A tenant name in a task message (`check_tenant_id`)."""


def _check_tenant(value: object, field: str) -> str | None:
    return None if value is None else check_tenant_id(value, field)


_ID_CHECKS: dict[object, Callable[[object, str], str | None]] = {
    str: check_id,
    ConversationId: check_conversation_id,
    TenantId | None: _check_tenant,
}
"""The check of each id annotation a task parameter may carry."""


def _problem(signature: inspect.Signature, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """Why these arguments do not fit `signature`, or None when they do."""
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as exc:
        return f"{exc} (got {len(args)} positional and {len(kwargs)} keyword arguments)"
    for name, value in bound.arguments.items():
        annotation = signature.parameters[name].annotation
        check = _ID_CHECKS.get(annotation)
        if check is not None:
            try:
                check(value, name)
            except InputLimitError as exc:
                return str(exc)
        elif annotation is int and (not isinstance(value, int) or isinstance(value, bool)):
            return f"{name} must be an integer, got {type(value).__name__}"
    return None
