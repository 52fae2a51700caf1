"""Follows the events of a conversation in a process of its own and writes each as a JSON line.

Run by the event tests as a child process (`python -m tests.integration.celery_events.event_follower`),
the way a web server streams a conversation to its clients: `EventFeed` over the PostgreSQL
turn store and the Redis live channel. Each line is
`{"event": <AgentEvent as JSON, with its cursor>, "received_at": <epoch seconds>}`, written
and flushed as the event arrives, so a follower killed at any moment leaves whole lines
behind (and at most one partial last line).

The follower stops once it has seen the terminal events of `--roots` root turns of the
conversation, after following `--linger` seconds more to catch anything that would
wrongly come after them; or when `--idle-timeout` seconds pass with no event.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import store
from agent_runner import AgentEvent, EventFeed
from agent_runner.persistence import EventScope


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--prefix", required=True, help="the Redis key prefix of the deployment")
    parser.add_argument("--conversation", required=True)
    parser.add_argument("--out", type=Path, required=True, help="JSON lines are appended here")
    parser.add_argument("--after", default=None, help="resume after this cursor")
    parser.add_argument("--roots", type=int, default=1, help="stop after this many root turns ended")
    parser.add_argument("--idle-timeout", type=float, default=60.0)
    parser.add_argument("--linger", type=float, default=1.0)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Follow the conversation and write its events; 0 once the root turns ended, 1 on an idle timeout."""
    args = _arguments(argv)
    turn_store = store.SqlAgentTurnStore(args.database_url)
    live = store.RedisLiveEvents(args.redis_url, prefix=args.prefix)
    feed = EventFeed(turn_store, live)
    ended = 0
    after: str | None = args.after
    try:
        with args.out.open("a", encoding="utf-8") as sink:

            def write(event: AgentEvent) -> None:
                line = {"event": event.model_dump(mode="json"), "received_at": time.time()}
                sink.write(json.dumps(line) + "\n")
                sink.flush()

            for event in feed.follow(
                EventScope.conversation(args.conversation), after=after, timeout=args.idle_timeout
            ):
                write(event)
                after = event.cursor
                if event.type.is_terminal and event.turn_id == event.root_turn_id:
                    ended += 1
                    if ended >= args.roots:
                        break
            else:
                print(f"no event for {args.idle_timeout}s after {ended} root turn(s) ended", file=sys.stderr)
                return 1
            for event in feed.follow(EventScope.conversation(args.conversation), after=after, timeout=args.linger):
                write(event)
    finally:
        live.close()
        turn_store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
