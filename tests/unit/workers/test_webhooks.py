"""Webhook settings, and the deliverer over a SQLite store: which events are owed, and that each goes once."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from agent_runner import Agent, AgentRunner, AiMessage, ScriptedChatModel, ToolCall
from store import SqlAgentTurnStore
from store.webhooks import DeliveryStatus, WebhookDeliveryLog, WebhookKind
from tests.helpers.webhook_receiver import WebhookReceiver, webhook_env, webhook_receiver
from workers.settings import SettingsError, WebhookSettings, WorkerSettings, parse_webhook_urls
from workers.webhook_deliverer import WebhookDeliverer, sign

SECRET = "unit-secret"


def test_webhook_urls_are_read_per_kind() -> None:
    spec = "waiting=https://app.example/hooks/wait, ended=http://10.0.0.5:8080/end"
    assert parse_webhook_urls(spec) == {
        "waiting": "https://app.example/hooks/wait",
        "ended": "http://10.0.0.5:8080/end",
    }


@pytest.mark.parametrize(
    ("spec", "complaint"),
    [
        ("done=https://a.example/x", "kind=url"),
        ("https://a.example/x", "kind=url"),
        ("waiting=https://a.example/x,waiting=https://b.example/y", "given twice"),
        ("failed=ftp://a.example/x", "not an http"),
        ("ended=https:///no-host", "not an http"),
    ],
)
def test_unusable_webhook_urls_are_refused_naming_the_variable(spec: str, complaint: str) -> None:
    with pytest.raises(SettingsError, match=complaint) as raised:
        parse_webhook_urls(spec)
    assert "AGENT_RUNNER_WEBHOOKS" in str(raised.value)


def test_webhooks_without_a_secret_are_refused() -> None:
    with pytest.raises(SettingsError, match="AGENT_RUNNER_WEBHOOK_SECRET"):
        WorkerSettings.from_env({"AGENT_RUNNER_WEBHOOKS": "ended=https://a.example/x"})


def test_webhook_numbers_must_be_positive() -> None:
    env = {"AGENT_RUNNER_WEBHOOKS": "ended=https://a.example/x", "AGENT_RUNNER_WEBHOOK_SECRET": "s"}
    with pytest.raises(SettingsError, match="AGENT_RUNNER_WEBHOOK_MAX_ATTEMPTS"):
        WebhookSettings.from_env({**env, "AGENT_RUNNER_WEBHOOK_MAX_ATTEMPTS": "0"})
    with pytest.raises(SettingsError, match="AGENT_RUNNER_WEBHOOK_BACKOFF_S"):
        WebhookSettings.from_env({**env, "AGENT_RUNNER_WEBHOOK_BACKOFF_S": "soon"})


def test_worker_settings_carry_the_webhooks_and_none_without_them() -> None:
    assert WorkerSettings.from_env({}).webhooks is None
    env = {"AGENT_RUNNER_WEBHOOKS": "failed=https://a.example/f", "AGENT_RUNNER_WEBHOOK_SECRET": "s"}
    webhooks = WorkerSettings.from_env(env).webhooks
    assert webhooks is not None and webhooks.urls == {"failed": "https://a.example/f"}
    assert "'s'" not in repr(webhooks)  # the secret stays out of logs


def test_backoff_doubles_up_to_its_ceiling() -> None:
    settings = WebhookSettings(urls={}, secret="s", backoff_s=2.0, max_backoff_s=10.0)
    assert [settings.backoff(n).total_seconds() for n in (1, 2, 3, 4)] == [2.0, 4.0, 8.0, 10.0]


def test_the_signature_is_hmac_sha256_of_timestamp_dot_body() -> None:
    # Worked out with: printf '1700000000.{"a":1}' | openssl dgst -sha256 -hmac key
    expected = "sha256=a438e398bfafc57e4396bb7fc2304422f0f768e965d073ca313cb52e22e6ad03"
    assert sign("key", "1700000000", b'{"a":1}') == expected


# --- the deliverer over a SQLite store ---------------------------------------------------------


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with webhook_receiver() as running:
        yield running


def _settings(receiver: WebhookReceiver, **overrides: str) -> WebhookSettings:
    settings = WebhookSettings.from_env(webhook_env(receiver, SECRET, **overrides))
    assert settings is not None
    return settings


def _runner(url: str) -> AgentRunner:
    return AgentRunner(turn_store=SqlAgentTurnStore(url))


def _echo(answer: str = "ok") -> Agent:
    return Agent(id="echo", chat_model=ScriptedChatModel([AiMessage(content=answer)]))


def test_two_deliverers_on_one_store_send_each_event_once(tmp_path: Path, receiver: WebhookReceiver) -> None:
    # Given: two processes' deliverers on one store, and a completed turn
    url = f"sqlite:///{tmp_path / 'hooks.db'}"
    turn = _runner(url).run(_echo(), "hi")
    deliverers = [WebhookDeliverer(_settings(receiver), WebhookDeliveryLog(url)) for _ in range(2)]
    # When: both run several rounds
    for _ in range(3):
        for deliverer in deliverers:
            deliverer.run_once()
    # Then: the ended webhook went once
    assert [(r.path, r.payload["event"]["turn_id"]) for r in receiver.received] == [("/ended", turn.id)]


def test_a_receiver_refusal_other_than_408_or_429_is_dead_at_once(tmp_path: Path, receiver: WebhookReceiver) -> None:
    url = f"sqlite:///{tmp_path / 'hooks.db'}"
    receiver.answer = lambda path, payload, earlier: 410
    turn = _runner(url).run(_echo(), "hi")
    log = WebhookDeliveryLog(url)
    deliverer = WebhookDeliverer(_settings(receiver), log)
    deliverer.run_once()
    [letter] = log.list_deliveries(DeliveryStatus.DEAD)
    assert (letter.attempts, letter.last_status_code, letter.body["event"]["turn_id"]) == (1, 410, turn.id)


def test_a_receiver_that_does_not_answer_is_retried_after_its_backoff(tmp_path: Path) -> None:
    # Given: a URL where nothing listens (connection refused)
    url = f"sqlite:///{tmp_path / 'hooks.db'}"
    _runner(url).run(_echo(), "hi")
    settings = WebhookSettings(urls={"ended": "http://127.0.0.1:9/ended"}, secret="s", backoff_s=30.0)
    now = datetime(2030, 1, 1, tzinfo=UTC)
    clock = [now]
    log = WebhookDeliveryLog(url)
    deliverer = WebhookDeliverer(settings, log, clock=lambda: clock[0])
    # The turn ran "now" by the real clock; look that far back from the test's clock
    log.discover(
        {WebhookKind.ENDED: settings.urls["ended"]}, datetime.now(UTC), lookback=timedelta(hours=1), lag=timedelta(0)
    )
    deliverer.run_once()
    [pending] = log.list_deliveries(DeliveryStatus.PENDING)
    assert pending.attempts == 1 and pending.last_error is not None
    assert pending.next_attempt_at == now + timedelta(seconds=30)
    # When: the backoff has not passed, nothing is tried; once it has, the second attempt is made
    clock[0] = now + timedelta(seconds=29)
    deliverer.run_once()
    assert log.list_deliveries()[0].attempts == 1
    clock[0] = now + timedelta(seconds=31)
    deliverer.run_once()
    assert log.list_deliveries()[0].attempts == 2


def test_only_waits_for_a_person_and_ends_of_root_turns_are_reported(tmp_path: Path, receiver: WebhookReceiver) -> None:
    # Given: a lead turn that delegates to a sub-agent (the lead waits for the child in between)
    url = f"sqlite:///{tmp_path / 'hooks.db'}"
    helper = _echo("helped")
    model = ScriptedChatModel(
        [AiMessage(tool_calls=[ToolCall(id="d1", name="echo", arguments={"task": "help"})]), AiMessage("done")]
    )
    lead = _runner(url).run(Agent(id="lead", chat_model=model, sub_agents=[helper]), "go")
    # When: webhooks are delivered
    WebhookDeliverer(_settings(receiver), WebhookDeliveryLog(url)).run_once()
    # Then: only the root turn's end is reported: waiting for a child is nobody's job, nor is the child's end
    assert [(r.path, r.payload["event"]["turn_id"]) for r in receiver.received] == [("/ended", lead.id)]


def test_a_kind_without_a_url_is_not_sent(tmp_path: Path, receiver: WebhookReceiver) -> None:
    url = f"sqlite:///{tmp_path / 'hooks.db'}"
    _runner(url).run(_echo(), "hi")
    settings = WebhookSettings(urls={"failed": f"{receiver.url}/failed"}, secret=SECRET)
    log = WebhookDeliveryLog(url)
    WebhookDeliverer(settings, log).run_once()
    assert receiver.received == [] and log.list_deliveries() == []
