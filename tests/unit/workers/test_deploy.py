"""The deployment files parse, and every command they run is a real entry point of this project."""

from __future__ import annotations

import importlib
import re
import shlex
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from celery import Celery
from celery.bin.base import CLIContext
from celery.bin.celery import celery as celery_cli

from workers.api.server_settings import ApiSettings
from workers.settings import WorkerSettings

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"
OUR_IMAGES = ("agent-runner:", "registry.example.com/agent-runner:")

# Executables of third-party images that the files may run (health checks, servers).
THIRD_PARTY = {"postgres": {"pg_isready"}, "redis": {"redis-server", "redis-cli"}}

# Celery subcommands shipped by plugins the image installs, beside Celery's own.
PLUGIN_SUBCOMMANDS = {"flower": "flower"}


def _known_variables() -> set[str]:
    source = (ROOT / "workers" / "settings.py").read_text() + (ROOT / "workers" / "webhook_deliverer.py").read_text()
    # The HTTP server's own settings (keys, worker mode, CORS origins, token secret).
    source += "".join(
        (ROOT / "workers" / "api" / name).read_text() for name in ("server_settings.py", "cors.py", "tokens.py")
    )
    # The telemetry modules read the standard OTEL_* variables (and their own) too.
    source += "".join(path.read_text() for path in sorted((ROOT / "workers" / "telemetry").glob("*.py")))
    return set(re.findall(r'"((?:AGENT_RUNNER|CELERY|OTEL)_[A-Z_]+)"', source))


def _console_scripts() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return dict(project.get("scripts", {}))


def check_command(argv: list[str], image: str = "agent-runner:local") -> None:
    """Fail unless `argv` is a command the image can run: a real Celery app and subcommand, or a console script."""
    assert argv, "empty command"
    program, *args = argv
    if not image.startswith(OUR_IMAGES):
        base = image.split("/")[-1].split(":")[0]
        assert program in THIRD_PARTY.get(base, set()), f"{program!r} is not known to run in {image!r}"
        return
    if program == "celery":
        _check_celery(args)
    elif program in _console_scripts():
        _check_console_script(_console_scripts()[program], args)
    elif program in ("python", "python3") and args[:1] == ["-m"]:
        importlib.import_module(args[1])
    else:
        pytest.fail(f"{argv} runs {program!r}, which is not an entry point of this project")


def _check_celery(args: list[str]) -> None:
    assert args[:1] in (["-A"], ["--app"]), f"celery needs -A <app> first, got {args}"
    target = args[1]
    module_name, _, attribute = target.partition(":")
    module = importlib.import_module(module_name)
    app = getattr(module, attribute or "app")
    assert isinstance(app, Celery), f"{target} is not a Celery app"
    subcommand = args[2]
    if subcommand in PLUGIN_SUBCOMMANDS:
        dockerfile = (DEPLOY / "Dockerfile").read_text()
        assert PLUGIN_SUBCOMMANDS[subcommand] in dockerfile, f"the image does not install {subcommand}"
        return
    command = celery_cli.commands.get(subcommand)
    assert command is not None, f"celery has no subcommand {subcommand!r}"
    # Parsing the options checks their names and values without running anything.
    try:
        command.make_context(subcommand, list(args[3:]), obj=CLIContext(app, no_color=True, workdir=None, quiet=True))
    except click.UsageError as exc:
        raise AssertionError(f"celery {subcommand} {args[3:]}: {exc}") from exc


def _check_console_script(target: str, args: list[str]) -> None:
    module_name, _, attribute = target.partition(":")
    command: Any = getattr(importlib.import_module(module_name), attribute)
    used = 0
    for word in args:
        if word.startswith("-"):
            break
        assert isinstance(command, click.Group), f"{target} has no subcommand {word!r}"
        command = command.commands.get(word)
        assert command is not None, f"{target} has no subcommand {word!r}"
        used += 1
    assert isinstance(command, click.Command) and not isinstance(command, click.Group), f"{args} is incomplete"
    # Parsing the options checks their names and values without running anything.
    try:
        command.make_context(args[used - 1] if used else target, list(args[used:]))
    except click.UsageError as exc:
        raise AssertionError(f"{args}: {exc}") from exc


def _compose() -> dict[str, Any]:
    loaded = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    assert isinstance(loaded, dict)
    return loaded


def _k8s_documents() -> Iterator[tuple[Path, dict[str, Any]]]:
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document:
                yield path, document


def _pod_spec(document: dict[str, Any]) -> dict[str, Any] | None:
    if document["kind"] in ("Deployment", "Job", "StatefulSet", "DaemonSet"):
        spec: dict[str, Any] = document["spec"]["template"]["spec"]
        return spec
    return None


def _env_example() -> dict[str, str]:
    values: dict[str, str] = {}
    for line in (DEPLOY / ".env.example").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            values[key] = value
    return values


# --- compose ----------------------------------------------------------------------------------


def test_every_compose_command_is_a_real_entry_point() -> None:
    services = _compose()["services"]
    checked = 0
    for name, service in services.items():
        image = service.get("image", "agent-runner:local")
        if "command" in service:
            command = service["command"]
            check_command(command if isinstance(command, list) else shlex.split(command), image)
            checked += 1
        health = service.get("healthcheck", {}).get("test")
        if health:
            assert health[0] in ("CMD", "CMD-SHELL"), f"{name}: healthcheck must use CMD"
            check_command(health[1:], image)
    assert checked >= 5


def test_compose_has_the_services_of_a_deployment() -> None:
    services = _compose()["services"]
    assert {"postgres", "redis", "migrate", "worker", "beat", "flower"} <= set(services)
    assert services["migrate"]["command"] == ["agent-runner", "db", "upgrade"]
    assert services["migrate"]["restart"] == "no"
    # --scale worker=N needs no fixed name or host port on the worker.
    assert "container_name" not in services["worker"] and "ports" not in services["worker"]
    assert services["worker"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert services["beat"]["command"][:4] == ["celery", "-A", "workers.app", "beat"]
    # The HTTP API enqueues for the workers and listens beyond loopback (so its keys are in .env)
    api = services["api"]
    assert api["command"][:2] == ["agent-runner", "serve"]
    assert _option(api["command"], "--worker") == "celery" and _option(api["command"], "--host") == "0.0.0.0"
    assert api["ports"] == [f"127.0.0.1:{_option(api['command'], '--port')}:{_option(api['command'], '--port')}"]
    assert api["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert ApiSettings.from_env(_env_example()).keys.enabled


def _option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_compose_sets_only_variables_the_workers_read() -> None:
    known = _known_variables()
    app = _compose()["x-app"]
    assert set(app["environment"]) <= known


# --- Kubernetes -------------------------------------------------------------------------------


def test_every_kubernetes_container_runs_a_real_entry_point() -> None:
    containers = 0
    for path, document in _k8s_documents():
        pod = _pod_spec(document)
        if pod is None:
            continue
        for container in pod.get("initContainers", []) + pod["containers"]:
            argv = list(container.get("command", [])) + list(container.get("args", []))
            try:
                check_command(argv, container["image"])
            except AssertionError as exc:
                raise AssertionError(f"{path.name}: {container['name']}: {exc}") from exc
            containers += 1
    assert containers == 4


def test_kubernetes_manifests_have_one_beat_workers_a_migration_job_and_the_settings() -> None:
    by_kind: dict[tuple[str, str], dict[str, Any]] = {
        (doc["kind"], doc["metadata"]["name"]): doc for _, doc in _k8s_documents() if "metadata" in doc
    }
    beat = by_kind[("Deployment", "agent-runner-beat")]
    assert beat["spec"]["replicas"] == 1
    assert beat["spec"]["strategy"]["type"] == "Recreate"
    assert ("Deployment", "agent-runner-worker") in by_kind
    _check_api(by_kind)
    job = by_kind[("Job", "agent-runner-migrate")]
    assert job["spec"]["template"]["spec"]["containers"][0]["command"] == ["agent-runner", "db", "upgrade"]

    config = by_kind[("ConfigMap", "agent-runner")]["data"]
    secret = by_kind[("Secret", "agent-runner")]["stringData"]
    assert set(config) | set(secret) <= _known_variables()
    # The URLs with credentials live in the Secret only.
    assert {"AGENT_RUNNER_DATABASE_URL", "AGENT_RUNNER_REDIS_URL", "CELERY_BROKER_URL"} <= set(secret)
    assert not {"AGENT_RUNNER_DATABASE_URL", "AGENT_RUNNER_REDIS_URL", "CELERY_BROKER_URL"} & set(config)
    WorkerSettings.from_env({**config, **secret})
    assert ApiSettings.from_env({**config, **secret}).keys.enabled
    assert {"AGENT_RUNNER_API_KEYS", "AGENT_RUNNER_TOKEN_SECRET"} <= set(secret)

    for _, document in _k8s_documents():
        pod = _pod_spec(document)
        for container in (pod or {}).get("containers", []):
            refs = {ref[key]["name"] for ref in container.get("envFrom", []) for key in ref}
            assert refs == {"agent-runner"}


def _check_api(by_kind: dict[tuple[str, str], dict[str, Any]]) -> None:
    """The API Deployment serves with Celery workers, is probed on /readyz and /healthz, and its Service reaches it."""
    deployment = by_kind[("Deployment", "agent-runner-api")]
    pod = deployment["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    command = container["command"]
    assert command[:2] == ["agent-runner", "serve"] and _option(command, "--worker") == "celery"
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"http": int(_option(command, "--port"))}
    readiness, liveness = container["readinessProbe"]["httpGet"], container["livenessProbe"]["httpGet"]
    assert (readiness["path"], readiness["port"]) == ("/readyz", "http")
    assert (liveness["path"], liveness["port"]) == ("/healthz", "http")
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    service = by_kind[("Service", "agent-runner-api")]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == "api"
    assert [port["targetPort"] for port in service["spec"]["ports"]] == ["http"]


def test_kustomization_lists_every_manifest() -> None:
    listed = set(yaml.safe_load((DEPLOY / "k8s" / "kustomization.yaml").read_text())["resources"])
    assert listed == {p.name for p in (DEPLOY / "k8s").glob("*.yaml")} - {"kustomization.yaml"}


# --- .env.example -----------------------------------------------------------------------------


def test_env_example_holds_valid_settings_of_known_variables() -> None:
    values = _env_example()
    known = _known_variables() | {"POSTGRES_PASSWORD"}
    assert set(values) <= known
    settings = WorkerSettings.from_env(values)
    assert settings.agent_loader == "workers.demo:build_agent"


def test_the_example_agent_loader_resolves() -> None:
    from workers.agents import load_agent_loader

    loader = load_agent_loader(_env_example()["AGENT_RUNNER_AGENT_LOADER"])
    assert loader.load(_env_example()["AGENT_RUNNER_INBOX_AGENT"]).id == "support-agent"


def _extras(requested: set[str]) -> set[str]:
    """The extras of the project that installing `requested` brings in (`all` names others)."""
    import tomllib

    optional = tomllib.loads((DEPLOY.parent / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    found: set[str] = set()
    pending = list(requested)
    while pending:
        extra = pending.pop()
        if extra in found:
            continue
        found.add(extra)
        for requirement in optional[extra]:
            nested = re.fullmatch(r"agent-runner\[([^\]]*)\]", requirement)
            if nested:
                pending += [name.strip() for name in nested.group(1).split(",")]
    return found


def test_dockerfile_installs_the_packages_the_commands_need() -> None:
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    match = re.search(r'pip install "?\.\[([^\]]*)\]', dockerfile)
    assert match is not None, "the image does not install the project with extras"
    installed = _extras({name.strip() for name in match.group(1).split(",")})
    # The workers and beat (celery), the migration (cli), `agent-runner serve` (api) and the
    # OpenAI adapter the README shows.
    assert {"celery", "cli", "api", "openai"} <= installed, installed
    assert "USER 10001" in dockerfile


def test_a_wrong_command_is_rejected() -> None:
    # The checker itself must fail on the mistakes it exists to catch.
    for argv in (
        ["celery", "-A", "workers.app", "wroker"],
        ["celery", "-A", "workers.nope", "worker"],
        ["celery", "-A", "workers.app", "worker", "--concurrancy=2"],
        ["celery", "-A", "workers.app", "worker", "--loglevel=LOUD"],
        ["agent-runner", "db", "upgrad"],
        ["agent-runner", "db"],
        ["agent-runner", "serve", "--worker", "threads"],
        ["agent-runner", "serve", "--prot", "8000"],
        ["migrate.sh"],
    ):
        with pytest.raises((AssertionError, ImportError, pytest.fail.Exception)):
            check_command(argv)
