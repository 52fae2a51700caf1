"""What an append to SqlChatMemory costs, and that concurrent appenders keep one order."""

from __future__ import annotations

import threading

from test_sql_store_saves import recording

from agent_runner import AiMessage, UserMessage
from store import SqlChatMemoryProvider


def test_an_append_is_one_statement_on_postgresql(sql_url: str) -> None:
    with SqlChatMemoryProvider(sql_url) as provider:
        memory = provider("c-1")
        memory.append([UserMessage(id="m-0", content="hello")])
        batch = [AiMessage(id=f"m-{i}", content=f"reply {i}") for i in range(1, 4)]
        with recording(provider.engine) as recorded:
            memory.append(batch)
        if provider.engine.dialect.name == "postgresql":
            # The sequence counter and the messages in one autocommitted statement
            assert (recorded.statements, recorded.commits) == (["WITH"], 0)
        else:
            assert (recorded.statements, recorded.commits) == (["INSERT", "INSERT"], 1)
        assert [m.id for m in memory.get_messages(10)] == ["m-0", "m-1", "m-2", "m-3"]
        # Appending known ids again writes nothing new and keeps the order
        memory.append([batch[1], AiMessage(id="m-4", content="new")])
        assert [m.id for m in memory.get_messages(10)] == ["m-0", "m-1", "m-2", "m-3", "m-4"]


def test_an_append_larger_than_one_statement_takes_keeps_the_order(sql_url: str) -> None:
    with SqlChatMemoryProvider(sql_url) as provider:
        memory = provider("c-1")
        memory.append([UserMessage(id=f"m-{i}", content=f"message {i}") for i in range(40)])
        memory.append([UserMessage(id=f"m-{i}", content=f"message {i}") for i in range(35, 80)])
        assert [m.id for m in memory.get_messages(100)] == [f"m-{i}" for i in range(80)]


def test_concurrent_appenders_each_keep_their_order_and_lose_nothing(sql_url: str) -> None:
    with SqlChatMemoryProvider(sql_url) as provider:
        errors: list[BaseException] = []

        def append_many(writer: int) -> None:
            memory = provider("c-1")
            try:
                for n in range(25):
                    memory.append([UserMessage(id=f"w{writer}-{n}a", content="a"), AiMessage(id=f"w{writer}-{n}b")])
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=append_many, args=(writer,)) for writer in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert errors == []
        ids = [m.id for m in provider("c-1").get_messages(1000)]
        assert len(ids) == len(set(ids)) == 4 * 25 * 2
        for writer in range(4):
            mine = [i for i in ids if i.startswith(f"w{writer}-")]
            assert mine == [f"w{writer}-{n}{part}" for n in range(25) for part in "ab"]


def test_messages_before_a_message_page_back_through_the_timeline(sql_url: str) -> None:
    with SqlChatMemoryProvider(sql_url) as memories:
        memory = memories("c-page")
        memory.append([UserMessage(id=f"m{i}", content=f"text {i}") for i in range(5)])
        assert [m.id for m in memory.get_messages_before("m4", 2) or []] == ["m2", "m3"]
        assert [m.id for m in memory.get_messages_before("m2", 10) or []] == ["m0", "m1"]
        assert memory.get_messages_before("m0", 10) == []
        assert memory.get_messages_before("unknown", 10) is None
        assert memories("other").get_messages_before("m4", 2) is None
