"""Where a runner's events go live, for the events that are made outside its steps.

A deployment sends every event of its runner to a live channel (Redis under Celery, the
process's own channel in the embedded server) through an event listener. A queued inbox
message's MESSAGE_QUEUED event is not made by the runner: `store.Inbox` writes it with the
message. `announce` sends such an event the way the runner's own go, so a follower of the
conversation sees it at once, whichever path queued the message (the HTTP API or
`workers.inbox.enqueue_message` in a web app).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

from agent_runner import AgentEvent, AgentRunner

LivePublish = Callable[[AgentEvent], None]
"""Sends one event to a live channel; never raises (see `store.BackgroundPublisher`)."""

_PUBLISHERS: weakref.WeakKeyDictionary[AgentRunner, LivePublish] = weakref.WeakKeyDictionary()


def attach_live(runner: AgentRunner, publish: LivePublish) -> None:
    """Send every event of `runner` to `publish`, and the events `announce` is given for it too."""
    runner.add_event_listener(publish)
    _PUBLISHERS[runner] = publish


def announce(runner: AgentRunner, event: AgentEvent | None) -> bool:
    """Send `event` where `runner`'s events go live; False when there is no event or the runner has no live channel.

    A runner built by `workers.build_runner()` or by the HTTP server has one; a runner of
    your own has none, and its followers read the event from the event log.
    """
    publish = _PUBLISHERS.get(runner)
    if event is None or publish is None:
        return False
    publish(event)
    return True
