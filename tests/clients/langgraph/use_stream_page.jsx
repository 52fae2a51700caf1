// A chat page on the unmodified useStream hook of @langchain/langgraph-sdk/react.
// Opened as index.html?api=<server url>&assistant=<assistant id>[&apiKey=<key or token>][&thread=<id>];
// bundled by build_page.mjs. The thread id goes into the address once known, and the hook
// keeps the active run's id (reconnectOnMount), so a reload shows the thread and rejoins the run.
import { useState } from "react";
import { createRoot } from "react-dom/client";
import { useStream } from "@langchain/langgraph-sdk/react";

const params = new URLSearchParams(window.location.search);

function text(message) {
  return typeof message.content === "string" ? message.content : JSON.stringify(message.content);
}

function FormCard({ value, onResume }) {
  const properties = value.response_schema?.properties ?? {};
  const [data, setData] = useState({});
  return (
    <form
      id="form-card"
      onSubmit={(event) => {
        event.preventDefault();
        onResume(data);
      }}
    >
      <h2>{value.description}</h2>
      {Object.entries(properties).map(([name, schema]) => (
        <label key={name}>
          {name}
          {schema.enum ? (
            <select name={name} defaultValue="" onChange={(e) => setData({ ...data, [name]: e.target.value })}>
              <option value="" disabled>
                choose
              </option>
              {schema.enum.map((option) => (
                <option key={option} value={option}>
                  {option}
                </option>
              ))}
            </select>
          ) : (
            <input name={name} onChange={(e) => setData({ ...data, [name]: e.target.value })} />
          )}
        </label>
      ))}
      <button id="form-submit" type="submit">
        Submit
      </button>
    </form>
  );
}

function ApprovalCard({ value, onResume }) {
  const [request] = value.action_requests;
  const [review] = value.review_configs;
  return (
    <section id="approval-card">
      <h2>{request.name}</h2>
      <p>{request.description}</p>
      <pre id="approval-args">{JSON.stringify(request.args)}</pre>
      {review.allowed_decisions.map((decision) => (
        <button key={decision} id={`decision-${decision}`} onClick={() => onResume({ decisions: [{ type: decision }] })}>
          {decision}
        </button>
      ))}
    </section>
  );
}

function App() {
  const [threadId, setThreadId] = useState(params.get("thread"));
  const stream = useStream({
    apiUrl: params.get("api"),
    apiKey: params.get("apiKey") ?? undefined,
    assistantId: params.get("assistant"),
    messagesKey: "messages",
    threadId,
    onThreadId: (id) => {
      setThreadId(id);
      const address = new URL(window.location.href);
      address.searchParams.set("thread", id);
      window.history.replaceState(null, "", address);
    },
    reconnectOnMount: true,
    onCreated: (run) => {
      window.createdRuns = [...(window.createdRuns ?? []), run.run_id];
    },
  });
  const [draft, setDraft] = useState("");
  const interrupt = stream.interrupt;
  const resume = (value) => stream.submit(undefined, { command: { resume: value } });
  return (
    <main>
      <h1>useStream on agent-runner</h1>
      <ol id="messages">
        {stream.messages.map((message) => (
          <li key={message.id} className={`message ${message.type}`} data-type={message.type}>
            <b>{message.type}</b> {text(message)}
          </li>
        ))}
      </ol>
      {interrupt?.value?.type === "form" && <FormCard value={interrupt.value} onResume={resume} />}
      {interrupt?.value?.action_requests && <ApprovalCard value={interrupt.value} onResume={resume} />}
      <form
        id="composer"
        onSubmit={(event) => {
          event.preventDefault();
          stream.submit({ messages: [{ type: "human", content: draft }] });
          setDraft("");
        }}
      >
        <input id="draft" value={draft} onChange={(e) => setDraft(e.target.value)} />
        <button id="send" type="submit">
          Send
        </button>
      </form>
      <p id="status">{stream.isLoading ? "streaming" : "idle"}</p>
      {stream.error ? <p id="error">{String(stream.error)}</p> : null}
    </main>
  );
}

createRoot(document.getElementById("root")).render(<App />);
window.pageReady = true;
