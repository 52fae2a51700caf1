"""Models that take their leading fields positionally say so to type checkers, and stay in step with their fields."""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest

from agent_runner import (
    AiMessage,
    ChatRequest,
    ChatResponse,
    InputLimits,
    SystemMessage,
    ToolCall,
    ToolMessage,
    Usage,
    UserMessage,
)
from agent_runner._base import PositionalModel
from agent_runner.models import ToolSpec

TYPED = [
    ToolCall,
    SystemMessage,
    UserMessage,
    AiMessage,
    ToolMessage,
    Usage,
    InputLimits,
    ToolSpec,
    ChatRequest,
    ChatResponse,
]


def typed_init(model: type[PositionalModel]) -> ast.FunctionDef:
    """The `__init__` the class declares for type checkers only (under `if TYPE_CHECKING:`)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(model)))
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for statement in node.body:
                if isinstance(statement, ast.FunctionDef) and statement.name == "__init__":
                    return statement
    raise AssertionError(f"{model.__name__} declares no __init__ for type checkers")


@pytest.mark.parametrize("model", TYPED, ids=lambda m: m.__name__)
def test_the_declared_signature_matches_the_fields(model: type[PositionalModel]) -> None:
    init = typed_init(model)
    positional = [a.arg for a in init.args.args[1:]]
    keyword_only = [a.arg for a in init.args.kwonlyargs]
    # The positional parameters are the model's positional fields, in their order
    assert positional == list(model._positional)
    # Every field can be passed, by its alias where it has one, and nothing else
    fields = {field.alias or name: field for name, field in model.model_fields.items()}
    assert sorted(positional + keyword_only) == sorted(fields)
    # A parameter has a default exactly when its field does
    defaults = positional[len(positional) - len(init.args.defaults) :] + [
        a.arg for a, default in zip(init.args.kwonlyargs, init.args.kw_defaults, strict=True) if default is not None
    ]
    assert sorted(defaults) == sorted(name for name, field in fields.items() if not field.is_required())


def test_positional_construction_type_checks_and_builds_the_same_models() -> None:
    # This module is type-checked with the project (strict mypy): these calls must pass it.
    call = ToolCall("c-1", "lookup", {"order": "1001"})
    assert call == ToolCall(id="c-1", name="lookup", arguments={"order": "1001"})
    assert UserMessage("hi").content == "hi"
    assert SystemMessage("be brief").content == "be brief"
    answer = AiMessage("checking", [call])
    assert answer.tool_calls == [call] and answer.content == "checking"
    result = ToolMessage("c-1", "lookup", "shipped", True)
    assert (result.tool_call_id, result.tool_name, result.content, result.is_error) == (
        "c-1",
        "lookup",
        "shipped",
        True,
    )
    assert Usage(3, 4, 0.5) == Usage(input_tokens=3, output_tokens=4, cost=0.5)
    assert InputLimits(32).max_json_depth == 32
    spec = ToolSpec("lookup", "Find an order")
    assert ChatRequest([UserMessage("hi", id="m-1")], [spec]).tools == [spec]
    assert ChatResponse(answer, Usage(1, 2)).usage.total_tokens == 3
