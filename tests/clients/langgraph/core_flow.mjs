// The core flow of a LangGraph client, with the unmodified @langchain/langgraph-sdk Client.
// Usage: node core_flow.mjs <server url> [api key]. Prints one JSON object per step.
import { Client } from "@langchain/langgraph-sdk";

const [apiUrl, apiKey] = process.argv.slice(2);
const client = new Client({ apiUrl, apiKey: apiKey ?? null });
const say = (step, data) => console.log(JSON.stringify({ step, ...data }));
const user = (content) => ({ messages: [{ type: "human", content }] });

const assistants = await client.assistants.search({ limit: 50 });
say("assistants", { ids: assistants.map((a) => a.assistant_id) });

const thread = await client.threads.create({ metadata: { client: "js" } });
say("thread", { thread_id: thread.thread_id, status: thread.status });

const events = [];
let tokens = "";
for await (const part of client.runs.stream(thread.thread_id, "writer", {
  input: user("story 8"),
  streamMode: ["values", "updates", "messages-tuple"],
})) {
  events.push(part.event);
  if (part.event === "messages") tokens += part.data[0].content;
  if (part.event === "values") say("values", { count: part.data.messages.length });
}
say("stream", { events, tokens });

const ticket = await client.threads.create();
const interrupts = [];
for await (const part of client.runs.stream(ticket.thread_id, "desk", {
  input: user("ticket"),
  streamMode: ["updates"],
})) {
  if (part.event === "updates" && part.data.__interrupt__) interrupts.push(...part.data.__interrupt__);
}
say("form_interrupt", { interrupts });

const state = await client.threads.getState(ticket.thread_id);
say("state", { next: state.next, interrupts: state.interrupts });

const approval = await client.runs.wait(ticket.thread_id, "desk", {
  command: { resume: { system: "web", scope: "ONE_USER" } },
});
say("approval_interrupt", { interrupts: approval.__interrupt__ });

const done = await client.runs.wait(ticket.thread_id, "desk", {
  command: { resume: { decisions: [{ type: "approve" }] } },
});
say("done", { last: done.messages.at(-1).content });

const finished = await client.threads.get(ticket.thread_id);
const runs = await client.runs.list(ticket.thread_id);
say("finished", { status: finished.status, runs: runs.map((r) => r.status) });

const [storyRun] = await client.runs.list(thread.thread_id);
const joined = [];
for await (const part of client.runs.joinStream(thread.thread_id, storyRun.run_id, {
  streamMode: ["messages-tuple"],
})) {
  if (part.event === "messages") joined.push(part.data[0].content);
}
say("joined", { tokens: joined.join("") });
