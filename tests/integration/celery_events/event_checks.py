"""Reading whole event streams, and the checks the event tests make on what a follower received."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from agent_runner import AgentEvent, AgentEventType, AgentTurn
from agent_runner.persistence import AgentTurnStore, EventScope

Reader = Callable[..., list[AgentEvent]]
"""`EventFeed.read`, `EventLog.read_events` or `LiveEventChannel.read` (same arguments)."""


def read_all(read: Reader, scope: EventScope, *, after: str | None = None, limit: int = 100) -> list[AgentEvent]:
    """Every event of `scope` that `read` returns after `after`, page by page, each after the last one's cursor."""
    events: list[AgentEvent] = []
    while True:
        page = read(scope, after=after, limit=limit)
        if not page:
            return events
        events.extend(page)
        after = page[-1].cursor


def durable(events: Sequence[AgentEvent]) -> list[AgentEvent]:
    return [e for e in events if e.type.is_durable]


def ephemeral(events: Sequence[AgentEvent]) -> list[AgentEvent]:
    return [e for e in events if not e.type.is_durable]


def ids(events: Sequence[AgentEvent]) -> list[str]:
    return [e.event_id for e in events]


def tree_turns(turn_store: AgentTurnStore, root_ids: Sequence[str]) -> dict[str, AgentTurn]:
    """The final snapshots of the given root turns and of all their descendants, by id."""
    found: dict[str, AgentTurn] = {}
    pending = list(root_ids)
    while pending:
        turn = turn_store.load(pending.pop(0))
        found[turn.id] = turn
        pending += [link.child_turn_id for link in turn.children]
    return found


def saved_position(event: AgentEvent) -> tuple[int, int]:
    """(version, n) of a durable event, read from its id `<turn_id>:<version>:<n>`."""
    turn_id, version, n = event.event_id.rsplit(":", 2)
    assert turn_id == event.turn_id, event
    return int(version), int(n)


def assert_turn_stories(
    events: Sequence[AgentEvent], turns: Mapping[str, AgentTurn], *, calls_ran_once: bool = True
) -> None:
    """Check each turn's part of a received stream against the turn's final snapshot.

    For every turn: its durable events come once each, in the order of the saves that wrote
    them (ids `<turn_id>:<version>:<n>` strictly increasing, `n` counting from 0 within a
    save, `version` matching the event's data), from TURN_STARTED at version 0 to the
    terminal event of its final save; nothing of the turn comes after that terminal event;
    there is one MODEL_RESPONSE per model call made; and the MODEL_DELTA events of each
    model call all arrive before its MODEL_RESPONSE and spell out its text. A worker that
    died inside a model call streamed the start of that call's text once more before the
    call ran again: unless `calls_ran_once`, deltas of such an abandoned stream may come
    before those that spell out the response.
    """
    assert len(set(ids(durable(events)))) == len(durable(events)), "a durable event came twice"
    assert {e.turn_id for e in events} == set(turns), "events of unknown turns, or turns without events"
    for turn_id, turn in turns.items():
        story = [e for e in events if e.turn_id == turn_id]
        saved = durable(story)
        positions = [saved_position(e) for e in saved]
        assert positions == sorted(set(positions)), f"turn {turn_id}: saves out of order: {positions}"
        for version in {v for v, _ in positions}:
            numbers = [n for v, n in positions if v == version]
            assert numbers == list(range(len(numbers))), f"turn {turn_id}: save {version} has events {numbers}"
        assert all(e.data["version"] == p[0] for e, p in zip(saved, positions, strict=True))
        assert saved[0].type is AgentEventType.TURN_STARTED and positions[0] == (0, 0), saved[0]
        last = saved[-1]
        assert last.type.is_terminal, f"turn {turn_id} has no terminal event last: {[e.type for e in saved]}"
        assert last.data["status"] == turn.status.value and positions[-1][0] == turn.version, (last, turn.version)
        assert story[-1] is last, f"turn {turn_id}: {[e.type.value for e in story[story.index(last) :]]}"
        _assert_deltas_spell_out_responses(turn_id, story, abandoned_streams=not calls_ran_once)
        responses = [e for e in story if e.type is AgentEventType.MODEL_RESPONSE]
        assert len(responses) == turn.model_iterations, (turn_id, len(responses), turn.model_iterations)


def _assert_deltas_spell_out_responses(turn_id: str, story: Sequence[AgentEvent], *, abandoned_streams: bool) -> None:
    """Each MODEL_RESPONSE's text was streamed in full, in order, by the deltas received before it."""
    streamed = ""
    for event in story:
        if event.type is AgentEventType.MODEL_DELTA:
            streamed += event.data["delta"]
        elif event.type is AgentEventType.MODEL_RESPONSE:
            content = event.data["content"] or ""
            # Deltas of the next call may already be in (its response may be committed later).
            start = streamed.find(content) if abandoned_streams else (0 if streamed.startswith(content) else -1)
            assert start >= 0, f"turn {turn_id}: {content!r} was not streamed before it (got {streamed!r})"
            streamed = streamed[start + len(content) :]
    assert streamed == "", f"turn {turn_id}: deltas of no model response: {streamed!r}"
