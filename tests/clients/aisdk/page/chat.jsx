// A small chat page on `useChat` (@ai-sdk/react) and `DefaultChatTransport`, served on the
// server's origin. The tenant key comes from the page's `?key=`, the chat id from `?chat=`.
// On load it shows the chat again as docs/ai-sdk.md says: the messages from
// GET {api}/{chat}/messages, then `useChat({id, messages, resume: true})`.
import { useChat } from '@ai-sdk/react';
import { DefaultChatTransport, lastAssistantMessageIsCompleteWithApprovalResponses } from 'ai';
import { useEffect, useMemo, useState } from 'react';
import { createRoot } from 'react-dom/client';

const params = new URLSearchParams(location.search);
const API = '/v1/agents/assistant/ai-sdk/chat';
const HEADERS = { Authorization: `Bearer ${params.get('key')}` };

function Part({ part, onApproval }) {
  if (part.type === 'text') return <p className="text">{part.text}</p>;
  if (part.type.startsWith('tool-')) {
    const name = part.type.slice('tool-'.length);
    return (
      <div className="tool" data-state={part.state}>
        <code>
          {name}({JSON.stringify(part.input)})
        </code>{' '}
        <span className="state">{part.state}</span>
        {part.state === 'approval-requested' && (
          <span>
            {' '}
            <button className="approve" onClick={() => onApproval(part.approval.id, true)}>
              Approve
            </button>{' '}
            <button className="reject" onClick={() => onApproval(part.approval.id, false)}>
              Reject
            </button>
          </span>
        )}
        {part.state === 'output-available' && <div className="output">{JSON.stringify(part.output)}</div>}
      </div>
    );
  }
  return null;
}

function App({ initialMessages }) {
  const transport = useMemo(() => new DefaultChatTransport({ api: API, headers: HEADERS }), []);
  const { messages, sendMessage, addToolApprovalResponse, status, error } = useChat({
    id: params.get('chat'),
    messages: initialMessages,
    resume: true,
    transport,
    sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses,
  });
  const [input, setInput] = useState('');
  return (
    <main>
      <h1>Support chat</h1>
      <ol id="messages">
        {messages.map(message => (
          <li key={message.id} className={message.role} data-status={message.metadata?.status ?? ''}>
            <b>{message.role}</b>
            {message.parts.map((part, index) => (
              <Part
                key={index}
                part={part}
                onApproval={(id, approved) => addToolApprovalResponse({ id, approved, reason: approved ? undefined : 'no' })}
              />
            ))}
          </li>
        ))}
      </ol>
      {error && <pre id="error">{error.message}</pre>}
      <form
        onSubmit={event => {
          event.preventDefault();
          sendMessage({ text: input });
          setInput('');
        }}
      >
        <input id="input" value={input} onChange={event => setInput(event.target.value)} placeholder="Ask something" />
        <button id="send" type="submit" disabled={status !== 'ready'}>
          Send
        </button>
        <span id="status">{status}</span>
      </form>
    </main>
  );
}

function Page() {
  const [initial, setInitial] = useState(null);
  const [failure, setFailure] = useState(null);
  useEffect(() => {
    fetch(`${API}/${encodeURIComponent(params.get('chat'))}/messages`, { headers: HEADERS })
      .then(async response => {
        if (!response.ok) throw new Error(await response.text());
        return response.json();
      })
      .then(setInitial, failed => setFailure(failed.message));
  }, []);
  if (failure) return <pre id="error">{failure}</pre>;
  if (initial === null) return <p id="loading">Loading the chat</p>;
  return <App initialMessages={initial} />;
}

createRoot(document.getElementById('root')).render(<Page />);
