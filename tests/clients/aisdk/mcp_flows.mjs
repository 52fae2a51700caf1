// An MCP server's questions answered through the AI SDK's chat and AG-UI's `HttpAgent`.
// Usage: node mcp_flows.mjs <flow> <base url> <key>; prints one JSON object per result.
// The agent `mcp-agent` calls the tool named in the user's text (a JSON object), call id `call-1`.
// The AI SDK flows import only `ai`, so they also run beside the `ai` 6 packages of ../aisdk6.
import { Chat, lastAssistant, print, text, transport, until } from './chat.mjs';

const [flow, baseUrl, key] = process.argv.slice(2);
const agentId = 'mcp-agent';
const ask = (tool, args) => JSON.stringify({ tool, arguments: args });

function newChat(id) {
  return new Chat({ id, transport: transport({ baseUrl, agentId, key }), messages: [], onError: () => {} });
}

/** What the chat's last message shows of the question the turn waits for. */
function question(chat, tool) {
  const message = lastAssistant(chat);
  const form = message.parts.find(p => p.type === 'data-form');
  const call = message.parts.find(p => p.type === `tool-${tool}`);
  return { form: form?.data ?? null, callId: call?.toolCallId ?? null, callState: call?.state ?? null, status: message.metadata?.status };
}

/** Answer the waiting call with `output` (or decline it with `errorText`), and send the chat. */
async function answer(chat, tool, callId, output, errorText) {
  if (errorText !== undefined) {
    await chat.addToolOutput({ tool, toolCallId: callId, state: 'output-error', errorText });
  } else {
    await chat.addToolOutput({ tool, toolCallId: callId, output });
  }
  await chat.sendMessage();
  await until(() => chat.status === 'ready' || chat.status === 'error', 'the answer to the question');
}

function ended(chat) {
  const message = lastAssistant(chat);
  return { status: chat.status, error: chat.error ? chat.error.message : null, text: text(message), metadata: message.metadata, parts: message.parts };
}

async function agUiRun(agent, parameters = {}) {
  const events = [];
  let error = null;
  try {
    await agent.runAgent({ runId: `run-${Date.now()}-${Math.random()}`, ...parameters }, { onEvent: ({ event }) => void events.push(event) });
  } catch (err) {
    error = err.message ?? String(err);
  }
  const finished = events.find(e => e.type === 'RUN_FINISHED') ?? null;
  return { error, events, outcome: finished?.outcome ?? null, result: finished?.result ?? null };
}

const flows = {
  // Two forms, one after the other, answered with addToolOutput; the booking completes.
  async 'aisdk-form'() {
    const chat = newChat(`mcp-form-${Date.now()}`);
    await chat.sendMessage({ text: ask('book_trip', { traveller: 'ann' }) });
    const first = question(chat, 'book_trip');
    print({ flow: 'asked', ...first });
    await answer(chat, 'book_trip', first.callId, { city: 'Oslo' });
    const second = question(chat, 'book_trip');
    print({ flow: 'asked-again', ...second, chatStatus: chat.status });
    await answer(chat, 'book_trip', second.callId, { nights: 3 });
    print({ flow: 'done', ...ended(chat) });
  },

  // A URL question: the link is shown; the person says they are done.
  async 'aisdk-url'() {
    const chat = newChat(`mcp-url-${Date.now()}`);
    await chat.sendMessage({ text: ask('link_account', {}) });
    const asked = question(chat, 'link_account');
    print({ flow: 'asked', ...asked });
    await answer(chat, 'link_account', asked.callId, { done: true });
    print({ flow: 'done', ...ended(chat) });
  },

  // The first form declined (an output error): the server hears `decline`, the model reads its answer.
  async 'aisdk-decline'() {
    const chat = newChat(`mcp-decline-${Date.now()}`);
    await chat.sendMessage({ text: ask('book_trip', { traveller: 'bo' }) });
    const asked = question(chat, 'book_trip');
    print({ flow: 'asked', ...asked });
    await answer(chat, 'book_trip', asked.callId, undefined, 'not now');
    print({ flow: 'done', ...ended(chat) });
  },

  // The same two forms as AG-UI interrupts, then a URL question.
  async agui() {
    const { HttpAgent } = await import('@ag-ui/client');
    const threadId = `mcp-agui-${Date.now()}`;
    const agent = new HttpAgent({ url: `${baseUrl}/v1/agents/${agentId}/ag-ui`, headers: { Authorization: `Bearer ${key}` }, threadId });
    agent.addMessage({ id: `u-${Date.now()}`, role: 'user', content: ask('book_trip', { traveller: 'cy' }) });
    const first = await agUiRun(agent);
    print({ flow: 'asked', ...first });
    const interrupt = first.outcome.interrupts[0];
    const second = await agUiRun(agent, { resume: [{ interruptId: interrupt.id, status: 'resolved', payload: { city: 'Lima' } }] });
    print({ flow: 'asked-again', ...second });
    const again = second.outcome.interrupts[0];
    const done = await agUiRun(agent, { resume: [{ interruptId: again.id, status: 'resolved', payload: { nights: 2 } }] });
    print({ flow: 'done', threadId, ...done });
  },
};

if (!flows[flow]) {
  console.error(`unknown flow ${flow}`);
  process.exit(2);
}
await flows[flow]();
