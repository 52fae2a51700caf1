// Drives an agent-runner server with AG-UI's `HttpAgent` (@ag-ui/client).
// Usage: node agui_flows.mjs <flow> <base url> [key] [other key]; prints one JSON object per run,
// with every event the client received (the Python test validates them against ag-ui-protocol).
import { HttpAgent } from '@ag-ui/client';

const [flow, baseUrl, key, otherKey] = process.argv.slice(2);
let runs = 0;

function newAgent(threadId, options = {}) {
  const k = options.key ?? key;
  return new HttpAgent({
    url: `${baseUrl}/v1/agents/assistant/ag-ui`,
    headers: k ? { Authorization: `Bearer ${k}` } : {},
    threadId,
    fetch: options.fetch,
  });
}

function print(value) {
  process.stdout.write(JSON.stringify(value) + '\n');
}

function assistantText(agent) {
  return agent.messages
    .filter(m => m.role === 'assistant' && typeof m.content === 'string')
    .map(m => m.content)
    .join('|');
}

/** One run; returns what the client saw. */
async function run(agent, parameters = {}) {
  const events = [];
  let error = null;
  try {
    await agent.runAgent({ runId: `run-${Date.now()}-${++runs}`, ...parameters }, { onEvent: ({ event }) => void events.push(event) });
  } catch (err) {
    error = err.message ?? String(err);
  }
  const finished = events.find(e => e.type === 'RUN_FINISHED') ?? null;
  return {
    error,
    events,
    types: events.map(e => e.type),
    outcome: finished?.outcome ?? null,
    result: finished?.result ?? null,
    runError: events.find(e => e.type === 'RUN_ERROR') ?? null,
    pendingInterrupts: agent.pendingInterrupts,
    messages: agent.messages,
    text: assistantText(agent),
  };
}

function say(agent, content) {
  agent.addMessage({ id: `u-${Date.now()}-${++runs}`, role: 'user', content });
}

const flows = {
  async answer() {
    const agent = newAgent(`answer-${Date.now()}`);
    say(agent, 'hello world');
    print({ flow: 'answer', ...(await run(agent)) });
  },

  async approval() {
    for (const approved of [true, false]) {
      const agent = newAgent(`approval-${approved}-${Date.now()}`);
      say(agent, 'deploy billing');
      const first = await run(agent);
      print({ flow: 'approval-requested', approved, ...first });
      const interrupt = first.outcome.interrupts[0];
      const payload = approved ? { approved: true } : { approved: false, reason: 'not on a Friday' };
      const second = await run(agent, { resume: [{ interruptId: interrupt.id, status: 'resolved', payload }] });
      print({ flow: 'approval-answered', approved, ...second });
    }
  },

  async form() {
    const agent = newAgent(`form-${Date.now()}`);
    say(agent, 'ticket');
    const first = await run(agent);
    print({ flow: 'form-requested', ...first });
    const interrupt = first.outcome.interrupts[0];
    const refused = await run(agent, {
      resume: [{ interruptId: interrupt.id, status: 'resolved', payload: { system: 'x', scope: 'SOME' } }],
    });
    print({ flow: 'form-refused', ...refused });
    const filled = await run(agent, {
      resume: [{ interruptId: interrupt.id, status: 'resolved', payload: { system: 'vpn', scope: 'ALL_USERS' } }],
    });
    print({ flow: 'form-filled', ...filled });
  },

  async failure() {
    const agent = newAgent(`fail-${Date.now()}`);
    say(agent, 'fail');
    print({ flow: 'failure', ...(await run(agent)) });
  },

  // A run whose connection is dropped mid-answer (the client aborts its request); the turn
  // goes on, and the client runs again with the same messages (nothing new): a snapshot of
  // the thread, then the rest of the turn, its current text again from the start.
  async reconnect() {
    const threadId = `reconnect-${Date.now()}`;
    const agent = newAgent(threadId);
    say(agent, 'story 12');
    const seen = [];
    let contents = 0;
    try {
      await agent.runAgent(
        { runId: `run-${Date.now()}-${++runs}` },
        {
          onEvent: ({ event }) => {
            seen.push(event);
            if (event.type === 'TEXT_MESSAGE_CONTENT' && ++contents === 3) agent.abortRun();
          },
        },
      );
    } catch (err) {
      seen.push({ aborted: String(err) });
    }
    const again = await run(agent);
    const whole = newAgent(`${threadId}-whole`);
    say(whole, 'story 12');
    const uninterrupted = await run(whole);
    print({ flow: 'reconnect', dropped: { types: seen.map(e => e.type ?? 'aborted'), events: seen.filter(e => e.type) }, again, uninterrupted });
  },

  async stop() {
    const threadId = `stop-${Date.now()}`;
    const agent = newAgent(threadId);
    say(agent, 'story 40');
    const running = run(agent);
    await new Promise(resolve => setTimeout(resolve, 800));
    const stopped = await fetch(`${baseUrl}/v1/agents/assistant/ag-ui/${threadId}/stop`, {
      method: 'POST',
      headers: key ? { Authorization: `Bearer ${key}` } : {},
    });
    print({ flow: 'stop', stopStatus: stopped.status, ...(await running) });
  },

  async tenants() {
    const threadId = `shared-${Date.now()}`;
    const a = newAgent(threadId, { key });
    const b = newAgent(threadId, { key: otherKey });
    say(a, 'hello from a');
    const first = await run(a);
    say(b, 'deploy api');
    const second = await run(b);
    // a reconnects: a snapshot of a's thread only, and no interrupt of b's
    const probe = newAgent(threadId, { key });
    const probed = await run(probe);
    // b reconnects: b's thread, and the interrupt its turn still waits for
    const probeB = newAgent(threadId, { key: otherKey });
    const probedB = await run(probeB);
    print({ flow: 'tenants', first, second, probed, probedB });
  },
};

if (!flows[flow]) {
  console.error(`unknown flow ${flow}`);
  process.exit(2);
}
await flows[flow]();
