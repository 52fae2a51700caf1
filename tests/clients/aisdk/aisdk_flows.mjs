// Drives an agent-runner server with the AI SDK's chat (`AbstractChat` + `DefaultChatTransport`).
// Usage: node aisdk_flows.mjs <flow> <base url> [key] [other key]; prints one JSON object per result.
import {
  lastAssistantMessageIsCompleteWithApprovalResponses,
  lastAssistantMessageIsCompleteWithToolCalls,
  readUIMessageStream,
  parseJsonEventStream,
  uiMessageChunkSchema,
} from 'ai';
import { Chat, lastAssistant, print, text, transport, until } from './chat.mjs';

const [flow, baseUrl, key, otherKey] = process.argv.slice(2);
const agentId = 'assistant';

function newChat(id, options = {}) {
  return new Chat({
    id,
    transport: transport({ baseUrl, agentId, key: options.key ?? key, fetch: options.fetch }),
    sendAutomaticallyWhen: options.sendAutomaticallyWhen,
    messages: options.messages ?? [],
    onError: () => {},
  });
}

function summary(chat) {
  const message = chat.messages[chat.messages.length - 1];
  return {
    status: chat.status,
    error: chat.error ? chat.error.message : null,
    messages: chat.messages.length,
    role: message?.role ?? null,
    text: message ? text(message) : null,
    metadata: message?.metadata ?? null,
    parts: message ? message.parts : [],
  };
}

const flows = {
  // A streamed answer.
  async answer() {
    const chat = newChat(`answer-${Date.now()}`);
    await chat.sendMessage({ text: 'hello world' });
    print({ flow: 'answer', ...summary(chat) });
  },

  // A call waiting for approval, approved (and another rejected) with addToolApprovalResponse.
  async approval() {
    for (const approved of [true, false]) {
      const chat = newChat(`approval-${approved}-${Date.now()}`, {
        sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses,
      });
      await chat.sendMessage({ text: 'deploy billing' });
      const waiting = lastAssistant(chat);
      const part = waiting.parts.find(p => p.type === 'tool-deploy');
      print({ flow: 'approval-requested', approved, state: part?.state, input: part?.input, finish: waiting.metadata });
      await chat.addToolApprovalResponse({
        id: part.approval.id,
        approved,
        reason: approved ? undefined : 'not on a Friday',
      });
      await until(() => chat.status === 'ready' && text(lastAssistant(chat)).length > 0, 'the answer after the decision');
      print({ flow: 'approval-answered', approved, ...summary(chat) });
    }
  },

  // A form filled in through addToolOutput (first with data failing the schema, then valid data).
  async form() {
    const chat = newChat(`form-${Date.now()}`, { sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithToolCalls });
    await chat.sendMessage({ text: 'ticket' });
    const waiting = lastAssistant(chat);
    const form = waiting.parts.find(p => p.type === 'data-form');
    const call = waiting.parts.find(p => p.type === 'tool-request_user_input');
    print({ flow: 'form-requested', form: form?.data ?? null, call_state: call?.state ?? null });
    await chat.addToolOutput({ tool: 'request_user_input', toolCallId: call.toolCallId, output: { system: 'x', scope: 'SOME' } });
    await until(() => chat.status === 'error' || chat.status === 'ready', 'the answer to bad form data');
    print({ flow: 'form-refused', status: chat.status, error: chat.error ? chat.error.message : null });
    chat.clearError();
    // The refused data changed nothing: the same call is answered again, with valid data.
    await chat.addToolOutput({ tool: 'request_user_input', toolCallId: call.toolCallId, output: { system: 'vpn', scope: 'ALL_USERS' } });
    if (chat.status === 'ready' && text(lastAssistant(chat)).indexOf('ticket for') < 0) await chat.sendMessage();
    await until(() => chat.status === 'ready' && text(lastAssistant(chat)).includes('ticket for'), 'the answer after the form');
    print({ flow: 'form-filled', ...summary(chat) });
  },

  // A tool that runs without approval: found, and failing (an error the model reads).
  async tools() {
    for (const key of ['vpn', 'mainframe']) {
      const chat = newChat(`tools-${key}-${Date.now()}`);
      await chat.sendMessage({ text: `lookup ${key}` });
      print({ flow: 'tools', key, ...summary(chat) });
    }
  },

  // A failing turn: an error chunk, then finish.
  async failure() {
    const chat = newChat(`fail-${Date.now()}`);
    await chat.sendMessage({ text: 'fail' });
    print({ flow: 'failure', ...summary(chat) });
  },

  // A connection dropped mid-turn; a new client resumes (GET .../stream) and ends with the
  // same message as a client that never lost its connection.
  async reconnect() {
    const id = `reconnect-${Date.now()}`;
    let cut = null;
    // A fetch whose response body breaks after a few chunks, like a dropped connection.
    const breakingFetch = async (url, init) => {
      const response = await fetch(url, init);
      if (cut !== null) return response; // only the first connection drops
      let chunks = 0;
      const reader = response.body.getReader();
      const body = new ReadableStream({
        async pull(controller) {
          const { done, value } = await reader.read();
          if (done) return controller.close();
          controller.enqueue(value);
          if (++chunks === 4) {
            cut = Date.now();
            reader.cancel();
            controller.error(new TypeError('network error: connection dropped'));
          }
        },
      });
      return new Response(body, { status: response.status, headers: response.headers });
    };
    const dropped = newChat(id, { fetch: breakingFetch });
    await dropped.sendMessage({ text: 'story 12' });
    const partial = summary(dropped);
    // A page reload: the user message from the server's history, then resume; and the
    // dropped client itself resuming with its partial message.
    const reloaded = newChat(id, { messages: dropped.messages.filter(m => m.role === 'user') });
    await Promise.all([reloaded.resumeStream(), dropped.resumeStream()]);
    const uninterrupted = newChat(`${id}-whole`);
    await uninterrupted.sendMessage({ text: 'story 12' });
    print({
      flow: 'reconnect',
      cut: cut !== null,
      partial,
      reloaded: summary(reloaded),
      dropped: summary(dropped),
      uninterrupted: summary(uninterrupted),
    });
    const after = newChat(id, { messages: reloaded.messages });
    await after.resumeStream();
    print({ flow: 'reconnect-after-end', ...summary(after) });
  },

  // A long answer in the chat CHAT_ID (WORDS words), followed to its end on one connection,
  // whatever happens to the workers meanwhile; then a reloaded page resuming it finds it done.
  async story() {
    const id = process.env.CHAT_ID;
    const chat = newChat(id);
    await chat.sendMessage({ text: `story ${process.env.WORDS}` });
    print({ flow: 'story', ...summary(chat) });
  },

  // A page reloaded on the chat CHAT_ID whose first message was TEXT: resume the answer.
  async resume() {
    const chat = newChat(process.env.CHAT_ID, {
      messages: [{ id: 'first', role: 'user', parts: [{ type: 'text', text: process.env.TEXT }] }],
    });
    await chat.resumeStream();
    print({ flow: 'resume', ...summary(chat) });
  },

  // The same chat id under two tenants: two conversations that never meet.
  async tenants() {
    const id = `shared-${Date.now()}`;
    const first = newChat(id, { key });
    const second = newChat(id, { key: otherKey });
    await first.sendMessage({ text: 'hello from a' });
    await second.sendMessage({ text: 'hello from b' });
    await second.sendMessage({ text: 'deploy api' });
    // Tenant a has nothing active in its conversation; tenant b's waits for approval.
    const probeA = newChat(id, { key, messages: first.messages });
    await probeA.resumeStream();
    const probeB = newChat(id, { key: otherKey, messages: [] });
    await probeB.resumeStream();
    print({ flow: 'tenants', first: summary(first), second: summary(second), probeA: summary(probeA), probeB: summary(probeB) });
  },

  // readUIMessageStream over the raw chunks of the chat endpoint.
  async raw() {
    const response = await fetch(`${baseUrl}/v1/agents/${agentId}/ai-sdk/chat`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...(key ? { Authorization: `Bearer ${key}` } : {}) },
      body: JSON.stringify({ id: `raw-${Date.now()}`, messages: [{ id: 'u1', role: 'user', parts: [{ type: 'text', text: 'hello raw' }] }], trigger: 'submit-message' }),
    });
    const types = [];
    const chunks = parseJsonEventStream({ stream: response.body, schema: uiMessageChunkSchema }).pipeThrough(
      new TransformStream({
        transform(result, controller) {
          if (!result.success) throw result.error;
          types.push(result.value.type);
          controller.enqueue(result.value);
        },
      }),
    );
    let final = null;
    for await (const message of readUIMessageStream({ stream: chunks })) final = message;
    print({ flow: 'raw', header: response.headers.get('x-vercel-ai-ui-message-stream'), types, message: final });
  },
};

if (!flows[flow]) {
  console.error(`unknown flow ${flow}`);
  process.exit(2);
}
await flows[flow]();
