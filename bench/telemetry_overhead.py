"""What telemetry costs per step: the durable step with tracing and metrics on, against off.

Workload W K=10 (21 steps per turn, see `_common`) on the SQL store in PostgreSQL, the
step `bench/durable.py` measures, run by one runner per variant in the same process, on
the same schema, with the repetitions interleaved (off, metrics, tracing, both, off, ...)
so drift on the machine hits every variant alike:

- `off`: no instrumentation (the runner as `durable.py` builds it);
- `events only`: a listener that does nothing, to show what the runner's events cost by
  themselves (the metrics use a listener);
- `api only`: `instrument(runner)` with the OpenTelemetry API but no SDK provider (what a
  worker does when the extras are installed and no OTEL_* variable asks for traces) and
  metrics on;
- `metrics`: Prometheus metrics only;
- `tracing`: SDK tracer provider with a batch processor and an exporter that drops the
  spans (the cost inside the step, not the network's), no metrics;
- `tracing + metrics`: both, as a worker runs with OTEL_* set and a metrics port;
- `1/10 traced + metrics`: the same with one turn tree in ten sampled
  (`OTEL_TRACES_SAMPLER=parentbased_traceidratio`, `OTEL_TRACES_SAMPLER_ARG=0.1`).

The same variants on the in-memory store show the worst case: there a step costs tens of
microseconds, so the telemetry's fixed cost per step weighs the most.

Reported: steps per second (median of the repetitions, with min and max), the ratio of
each variant to `off` (median of the per-repetition ratios, with min and max), and the CPU
time this process spends per step, whose difference to `off` is what the telemetry itself
costs (it does not depend on how busy the database server is). The goal is a durable
ratio of at least 0.9 (within 10%).

Run: `python bench/telemetry_overhead.py [--quick] [--json PATH]`.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Sequence
from typing import Any

from _common import Stat, arguments, log, pg_schema, steps_per_turn, w_agent, write_results
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

import store
from agent_runner import AgentEvent, AgentExecutionPolicy, AgentRunner, InMemoryAgentTurnStore
from agent_runner.persistence import AgentTurnStore
from workers.telemetry import instrument

K = 10


class DroppingExporter(SpanExporter):
    """Accepts every batch and keeps nothing."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


def tracer_provider(exporter: DroppingExporter, sampled: float = 1.0) -> TracerProvider:
    # Sampling is decided once per turn tree, when its root is created; its steps follow.
    provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(sampled)))
    # A queue deep enough that no span is dropped: dropping would hide part of the cost.
    provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=1 << 20, max_export_batch_size=2048))
    return provider


def _ignore(event: AgentEvent) -> None:
    return None


Variant = tuple[str, Callable[[AgentRunner], None]]


def variants(provider: TracerProvider, sampled_provider: TracerProvider) -> list[Variant]:
    return [
        ("off", lambda runner: None),
        # What any event listener costs: the runner then builds an event object for everything
        # it emits. The metrics count ended turns, retries and resumes through one.
        ("events only", lambda runner: runner.add_event_listener(_ignore)),
        ("api only", lambda runner: None if instrument(runner, tracing=True, metrics=True) else None),
        ("metrics", lambda runner: None if instrument(runner, tracing=False, metrics=True) else None),
        (
            "tracing",
            lambda runner: None if instrument(runner, tracing=True, metrics=False, tracer_provider=provider) else None,
        ),
        (
            "tracing + metrics",
            lambda runner: None if instrument(runner, tracing=True, metrics=True, tracer_provider=provider) else None,
        ),
        (
            "1/10 traced + metrics",
            lambda runner: (
                None if instrument(runner, tracing=True, metrics=True, tracer_provider=sampled_provider) else None
            ),
        ),
    ]


def run_turns(runner: AgentRunner, turns: int) -> tuple[float, float]:
    """Run `turns` turns of W(K); return the seconds they took and the CPU seconds of this process."""
    agent = w_agent(K)
    cpu = time.process_time()
    started = time.perf_counter()
    for _ in range(turns):
        turn = runner.run(agent, "check my orders")
        if turn.status != "COMPLETED" or turn.steps != steps_per_turn(K):
            raise RuntimeError(f"unexpected end of a W({K}) turn: {turn.status} after {turn.steps} steps")
    return time.perf_counter() - started, time.process_time() - cpu


def compare(
    store_factory: Callable[[], AgentTurnStore], turns: int, reps: int, providers: tuple[TracerProvider, TracerProvider]
) -> dict[str, Any]:
    runners: dict[str, AgentRunner] = {}
    for name, setup in variants(*providers):
        runner = AgentRunner(turn_store=store_factory(), policy=AgentExecutionPolicy(max_steps=1000))
        setup(runner)
        runners[name] = runner
        run_turns(runner, 2)  # warm-up: statement caches, pools, first metric labels
    steps = turns * steps_per_turn(K)
    rates: dict[str, list[float]] = {name: [] for name in runners}
    cpu_us: dict[str, list[float]] = {name: [] for name in runners}
    ratios: dict[str, list[float]] = {name: [] for name in runners if name != "off"}
    extra_cpu_us: dict[str, list[float]] = {name: [] for name in ratios}
    names = list(runners)
    for rep in range(reps):
        # A different variant goes first each time, so none is favoured by its place.
        for name in names[rep % len(names) :] + names[: rep % len(names)]:
            runner = runners[name]
            gc.collect()
            seconds, cpu = run_turns(runner, turns)
            rates[name].append(steps / seconds)
            cpu_us[name].append(cpu * 1e6 / steps)
        for name in ratios:
            ratios[name].append(rates[name][-1] / rates["off"][-1])
            extra_cpu_us[name].append(cpu_us[name][-1] - cpu_us["off"][-1])
    results: dict[str, Any] = {}
    for name in runners:
        entry: dict[str, Any] = {
            "steps_per_s": Stat.of(rates[name]).as_dict(),
            "cpu_us_per_step": Stat.of(cpu_us[name]).as_dict(),
        }
        shown = ""
        if name in ratios:
            entry["ratio_to_off"] = Stat.of(ratios[name]).as_dict()
            entry["extra_cpu_us_per_step"] = Stat.of(extra_cpu_us[name]).as_dict()
            shown = (
                f", ratio {entry['ratio_to_off']['median']:.3f}"
                f" ({entry['ratio_to_off']['min']:.3f}-{entry['ratio_to_off']['max']:.3f}),"
                f" +{entry['extra_cpu_us_per_step']['median']:.0f} us CPU per step"
            )
        results[name] = entry
        log(
            f"    {name:<22} {entry['steps_per_s']['median']:>8,.0f} steps/s,"
            f" {entry['cpu_us_per_step']['median']:>6.0f} us CPU per step{shown}"
        )
    return results


def main() -> None:
    args = arguments(__doc__)
    reps = 7 if args.quick else 35
    scale = 0.5 if args.quick else 1.0
    exporter = DroppingExporter()
    providers = (tracer_provider(exporter), tracer_provider(exporter, sampled=0.1))
    results: dict[str, Any] = {"workload": f"W K={K}", "steps_per_turn": steps_per_turn(K)}
    with pg_schema("bench_otel") as (url, schema):
        engine = store.make_engine(url)
        try:
            log(f"telemetry overhead: durable step (PostgreSQL), {reps} repetitions")
            results["durable"] = compare(
                lambda: store.SqlAgentTurnStore(engine), max(1, round(2 * scale)), reps, providers
            )
        finally:
            engine.dispose()
    log(f"telemetry overhead: in-memory step, {reps} repetitions")
    results["in_memory"] = compare(InMemoryAgentTurnStore, max(5, round(20 * scale)), reps, providers)
    for provider in providers:
        provider.force_flush()
    results["spans_exported"] = exporter.spans
    for provider in providers:
        provider.shutdown()
    durable = results["durable"]["tracing + metrics"]["ratio_to_off"]["median"]
    log(f"durable step with tracing and metrics: {durable:.3f} of the speed without (goal: at least 0.9)")
    write_results(args.json, results)


if __name__ == "__main__":
    main()
