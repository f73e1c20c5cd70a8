// Drives agent_flow's AG-UI endpoint with the official @ag-ui/client, as a front end would.
//
//   node run.mjs http://127.0.0.1:PORT
//
// Three threads, each a scenario (tests/test_server_agui_client.py starts the server and its
// scripted model, and checks the report this prints as JSON on stdout):
//
// - chat: a run whose server tool writes the environment, then a run carrying a state edit
//   based on the version the client holds;
// - frontend: a front-end tool is offered, the model calls it, the run ends with the call
//   pending; the client answers with a tool message and runs again;
// - approval: the client declares approve_tool_call; the run ends with an approval call
//   pending; the client approves it with a tool message and runs again.
//
// Every run goes through HttpAgent.runAgent (which verifies the event order and applies the
// events to agent.state and agent.messages); its events are verified once more on their own
// with verifyEvents. After each run the report holds the client's rebuilt state beside the
// server's environment (GET /sessions/{id}).

import { HttpAgent, verifyEvents } from "@ag-ui/client";
import { from, lastValueFrom, toArray } from "rxjs";

const base = process.argv[2];
if (!base) {
  console.error("usage: node run.mjs BASE_URL");
  process.exit(2);
}

const PICK = {
  name: "pick_color",
  description: "Ask the user to pick a color.",
  parameters: { type: "object", properties: { hint: { type: "string" } }, required: ["hint"] },
};
const APPROVE = {
  name: "approve_tool_call",
  description: "Ask the user to approve a call the agent wants to make.",
  parameters: {
    type: "object",
    properties: {
      call_id: { type: "string" },
      tool_name: { type: "string" },
      arguments: { type: "object" },
      reason: { type: "string" },
    },
  },
};

async function serverState(threadId) {
  const response = await fetch(`${base}/sessions/${threadId}`);
  if (!response.ok) throw new Error(`GET /sessions/${threadId}: ${response.status}`);
  const view = await response.json();
  return { ...view.environment, version: view.environment_version };
}

async function run(agent, parameters) {
  const events = [];
  let finished = null;
  const { result, newMessages } = await agent.runAgent(parameters, {
    onEvent({ event }) {
      events.push(event);
    },
    onRunFinishedEvent(params) {
      finished = { outcome: params.outcome, pending: params.pendingToolCallIds ?? [] };
    },
  });
  // verifyEvents on its own, over everything the run sent (it throws on a bad sequence).
  const verified = await lastValueFrom(from(events).pipe(verifyEvents(false), toArray()));
  return {
    types: events.map((event) => event.type),
    verified: verified.length === events.length,
    result,
    finished,
    newMessages,
    state: structuredClone(agent.state),
    server: await serverState(agent.threadId),
    events,
  };
}

function userMessage(agent, text) {
  agent.addMessage({ id: crypto.randomUUID(), role: "user", content: text });
}

function toolMessage(agent, toolCallId, content) {
  agent.addMessage({ id: crypto.randomUUID(), role: "tool", toolCallId, content });
}

const report = {};

// chat
{
  const agent = new HttpAgent({ url: `${base}/agui`, threadId: "node-chat" });
  userMessage(agent, "take notes");
  const first = await run(agent);
  agent.setState({ ...agent.state, extensions: { ...agent.state.extensions, prefs: "blue" } });
  userMessage(agent, "remember blue");
  const second = await run(agent);
  report.chat = [first, second];
}

// frontend
{
  const agent = new HttpAgent({ url: `${base}/agui`, threadId: "node-frontend" });
  userMessage(agent, "paint it");
  const first = await run(agent, { tools: [PICK] });
  const pending = first.finished.pending;
  for (const id of pending) toolMessage(agent, id, "red");
  const second = await run(agent, { tools: [PICK] });
  report.frontend = [first, second];
}

// approval
{
  const agent = new HttpAgent({ url: `${base}/agui`, threadId: "node-approval" });
  userMessage(agent, "ship it");
  const first = await run(agent, { tools: [APPROVE] });
  for (const id of first.finished.pending) {
    toolMessage(agent, id, JSON.stringify({ approved: true, reason: "go ahead" }));
  }
  const second = await run(agent, { tools: [APPROVE] });
  report.approval = [first, second];
  report.approvalMessages = agent.messages;
}

process.stdout.write(JSON.stringify(report));
