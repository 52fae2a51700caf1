// A framework-free chat on the AI SDK's own `AbstractChat` (what `useChat` wraps), with
// `DefaultChatTransport` pointed at an agent-runner server. Shared by the scripts here.
import { AbstractChat, DefaultChatTransport } from 'ai';

class MemoryChatState {
  constructor(messages = []) {
    this.messages = messages;
    this.status = 'ready';
    this.error = undefined;
  }
  pushMessage = message => {
    this.messages = this.messages.concat(message);
  };
  popMessage = () => {
    this.messages = this.messages.slice(0, -1);
  };
  replaceMessage = (index, message) => {
    this.messages = [...this.messages.slice(0, index), message, ...this.messages.slice(index + 1)];
  };
  snapshot = value => structuredClone(value);
}

export class Chat extends AbstractChat {
  constructor({ messages, ...init }) {
    super({ ...init, state: new MemoryChatState(messages) });
  }
}

/** A transport of the server at `baseUrl` for the agent `agentId`, sending `key` as the bearer token. */
export function transport({ baseUrl, agentId, key, fetch }) {
  return new DefaultChatTransport({
    api: `${baseUrl}/v1/agents/${agentId}/ai-sdk/chat`,
    headers: key ? { Authorization: `Bearer ${key}` } : {},
    fetch,
  });
}

/** Wait until `predicate()` holds, polling; throws after `timeoutMs`. */
export async function until(predicate, what, timeoutMs = 90000) {
  const deadline = Date.now() + timeoutMs;
  while (!predicate()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise(resolve => setTimeout(resolve, 20));
  }
}

/** The parts of a message without what differs between two clients of the same turn (nothing, so far). */
export function lastAssistant(chat) {
  const message = chat.messages[chat.messages.length - 1];
  if (!message || message.role !== 'assistant') throw new Error(`the last message is not the assistant's: ${JSON.stringify(message)}`);
  return message;
}

export function text(message) {
  return message.parts.filter(part => part.type === 'text').map(part => part.text).join('');
}

export function print(value) {
  process.stdout.write(JSON.stringify(value) + '\n');
}
