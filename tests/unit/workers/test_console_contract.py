"""The console reads its lists of statuses and event types from a module the server generates."""

from __future__ import annotations

import json
import re
from pathlib import Path

from fastapi.testclient import TestClient

from agent_runner import ActionStatus, AgentEventType, AgentTurnStatus, InMemoryAgentLoader
from agent_runner.events import EPHEMERAL_EVENT_TYPES, TERMINAL_EVENT_TYPES
from agent_runner.snapshot import WAITING_FOR_A_PERSON
from workers.api import create_app
from workers.api.contract import CONTRACT_PATH

CONSOLE_JS = Path(__file__).parents[3] / "workers" / "api" / "static" / "js"
EXPORT = re.compile(r"^export const (\w+) = Object\.freeze\((\[.*\])\);$")
NAMES = {s.value for s in AgentTurnStatus} | {t.value for t in AgentEventType}


def test_the_served_contract_lists_the_python_definitions(tmp_path: Path) -> None:
    app = create_app(database_url=f"sqlite:///{tmp_path / 'c.db'}", worker="none", agents=InMemoryAgentLoader([]))
    with TestClient(app) as client:
        answer = client.get(CONTRACT_PATH)
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/javascript")
    exports = {}
    for line in answer.text.splitlines()[1:]:
        match = EXPORT.match(line)
        assert match, line
        exports[match.group(1)] = json.loads(match.group(2))
    assert exports == {
        "TURN_STATUSES": [s.value for s in AgentTurnStatus],
        "TERMINAL_STATUSES": [s.value for s in AgentTurnStatus if s.is_terminal],
        "WAITING_FOR_A_PERSON": [s.value for s in AgentTurnStatus if s in WAITING_FOR_A_PERSON],
        "EVENT_TYPES": [t.value for t in AgentEventType],
        "TERMINAL_EVENT_TYPES": [t.value for t in AgentEventType if t in TERMINAL_EVENT_TYPES],
        "EPHEMERAL_EVENT_TYPES": [t.value for t in AgentEventType if t in EPHEMERAL_EVENT_TYPES],
    }


def hand_kept_lists(source: str) -> list[str]:
    """Array literals of a script that list two or more status or event type names."""
    found = []
    for literal in re.findall(r"\[[^\[\]]*\]", source):
        names = re.findall(r"\"([A-Z_]+)\"", literal)
        if len([n for n in names if n in NAMES]) >= 2:
            found.append(literal)
    return found


def test_the_console_scripts_keep_no_list_of_statuses_or_event_types_by_hand() -> None:
    scripts = sorted(CONSOLE_JS.rglob("*.js"))
    assert len(scripts) > 5
    for script in scripts:
        assert hand_kept_lists(script.read_text()) == [], script.name


def test_the_list_finder_sees_a_hand_kept_list() -> None:
    assert hand_kept_lists('const END = new Set(["TURN_FAILED", "TURN_COMPLETED", "BUDGET_EXCEEDED"]);')


def test_the_list_finder_sees_a_list_of_two_statuses() -> None:
    assert hand_kept_lists('const WAITING = ["WAITING_FOR_APPROVAL", "WAITING_FOR_USER"];')


def object_keys(source: str, name: str) -> set[str]:
    """The keys of the object literal `const NAME = { KEY: ..., ... };` of a script."""
    body = re.search(rf"const {name} = \{{(.*?)\}};", source, re.DOTALL)
    assert body, name
    return set(re.findall(r"^\s*([A-Z_]+):", body.group(1), re.MULTILINE))


def test_the_status_badges_name_only_statuses_that_exist() -> None:
    # A renamed or removed status would leave its badge class or text behind, unused.
    source = (CONSOLE_JS / "components.js").read_text()
    known = {s.value for s in AgentTurnStatus} | {s.value for s in ActionStatus}
    for name in ("STATUS_CLASS", "STATUS_TEXT"):
        keys = object_keys(source, name)
        assert keys and keys <= known, (name, keys - known)
    # Every status that has not ended has a class of its own (ended ones fall back to `bad`).
    unended = {s.value for s in AgentTurnStatus if not s.is_terminal}
    assert unended <= object_keys(source, "STATUS_CLASS")
