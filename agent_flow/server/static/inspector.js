// The agent_flow inspector: sessions, the live event stream, the environment tree, the token
// budget of every step, the plan, pending approvals and a message box. Plain JS, no build
// step, no CDN. The event stream is read with fetch (not EventSource) so that a bearer token
// can go in the Authorization header; it resumes after the last event id it received.
"use strict";

// `resolved` holds answered call ids: a session view fetched before the answer must not bring
// its card back, and an event must not add a card a view already added.
const state = { session: null, lastId: -1, abort: null, env: {}, oldEnv: {}, resolved: new Set(), spent: newSpent() };

// The session's model calls so far, summed from its events: tokens, and dollars while every
// call had a known price (one unknown price makes the total unknown, never a smaller sum).
function newSpent() { return { calls: 0, tokens: 0, usd: 0, unknown: false }; }

// As the terminal shows a cost: "$0.0123", "$1.20", or "cost unknown" (never "$0" for it).
function formatCost(usd) {
  if (usd === null || usd === undefined) return "cost unknown";
  if (usd === 0 || usd >= 0.01) return "$" + usd.toFixed(2);
  return "$" + usd.toFixed(6).replace(/0+$/, "");
}

function showSpent() {
  const s = state.spent;
  $("session-cost").textContent = `${s.calls} model calls · ${s.tokens} tokens · ${formatCost(s.unknown ? null : s.usd)}`;
}
const $ = (id) => document.getElementById(id);

// `agent-flow serve` prints the page's address with its token after "#token=": the fragment
// never leaves the browser (no server log, no Referer). Keep it for this tab, then drop it
// from the address bar.
const fromUrl = new URLSearchParams(location.hash.slice(1)).get("token");
if (fromUrl) {
  sessionStorage.setItem("agent_flow_token", fromUrl);
  history.replaceState(null, "", location.pathname + location.search);
}

function headers(method) {
  const h = {};
  const token = sessionStorage.getItem("agent_flow_token");
  if (token) h["Authorization"] = "Bearer " + token;
  // Every POST is JSON, an empty one too: a server without tokens refuses other POSTs.
  if (method !== "GET") h["Content-Type"] = "application/json";
  return h;
}

async function api(method, path, body) {
  const response = await fetch(path, {
    method, headers: headers(method),
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (response.status === 401) { $("token-box").hidden = false; throw new Error("token needed"); }
  if (!response.ok && response.status !== 204) {
    const error = await response.json().catch(() => ({ message: response.statusText }));
    throw new Error(error.message);
  }
  return response.status === 204 ? null : response.json();
}

function element(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "class") node.className = value; else node.setAttribute(key, value);
  }
  for (const child of children) node.append(child);
  return node;
}

async function loadSessions() {
  const { sessions } = await api("GET", "sessions");
  const list = $("sessions");
  list.replaceChildren(...sessions.map((s) => {
    const item = element("li", { "data-id": s.id }, s.title || s.id, element("small", {}, `${s.status}${s.running ? " · running" : ""}`));
    if (state.session === s.id) item.classList.add("selected");
    item.onclick = () => openSession(s.id);
    return item;
  }));
}

async function openSession(id) {
  if (state.abort) state.abort.abort();
  state.session = id; state.lastId = -1; state.env = {}; state.oldEnv = {}; state.resolved = new Set();
  state.spent = newSpent(); showSpent();
  $("session-pane").hidden = false;
  $("events").replaceChildren(); $("budget").replaceChildren(); $("approvals").replaceChildren();
  await refresh();
  await loadSessions();
  follow(id);
}

async function refresh() {
  const view = await api("GET", `sessions/${state.session}`);
  $("session-title").textContent = view.title || view.id;
  $("session-status").textContent = `${view.status} · ${view.state} · ${view.history.entries} history entries, ${view.history.tokens} tokens`;
  state.oldEnv = state.env; state.env = view.environment;
  $("environment").replaceChildren(tree(view.environment, state.oldEnv, ""));
  const plan = (view.environment.task && view.environment.task.plan) || [];
  $("plan").replaceChildren(...plan.map((step) => element("li", { class: step.completed ? "done" : "" }, step.description)));
  const pending = view.pending_approvals.filter((a) => !state.resolved.has(a.call_id));
  $("approvals").replaceChildren(...pending.map(approvalCard));
}

function tree(value, old, path) {
  if (value === null || typeof value !== "object") {
    const text = element("span", { class: "value" }, JSON.stringify(value));
    if (JSON.stringify(value) !== JSON.stringify(old)) text.classList.add("changed");
    return text;
  }
  const list = element("ul", { "data-path": path });
  for (const [key, child] of Object.entries(value)) {
    const previous = old && typeof old === "object" ? old[key] : undefined;
    list.append(element("li", { "data-pointer": `${path}/${key}` }, element("span", { class: "key" }, key + ": "), tree(child, previous, `${path}/${key}`)));
  }
  return list;
}

function approvalCard(approval) {
  const approve = element("button", { class: "approve", type: "button" }, "Approve");
  const deny = element("button", { class: "deny", type: "button" }, "Deny");
  const card = element("div", { class: "approval", "data-call": approval.call_id },
    element("strong", {}, `${approval.name} needs approval`), element("div", {}, approval.reason),
    element("code", {}, JSON.stringify(approval.arguments, null, 1)), approve, " ", deny);
  const answer = (approved) => async () => {
    state.resolved.add(approval.call_id);
    card.remove();
    await api("POST", `sessions/${state.session}/approvals/${encodeURIComponent(approval.call_id)}`, { approved });
  };
  approve.onclick = answer(true); deny.onclick = answer(false);
  return card;
}

function budgetBar(event) {
  const b = event.breakdown;
  const parts = [
    ["system", b.system_template + b.priming], ["environment", b.environment], ["tools", b.tools],
    ["history", b.history], ["reserve", b.reserve],
  ];
  const used = parts.reduce((sum, [, n]) => sum + n, 0);
  parts.push(["free", Math.max(0, b.budget - used)]);
  const bar = element("div", { class: "bar", title: `${b.total} of ${b.budget} tokens` });
  for (const [name, tokens] of parts) {
    const seg = element("span", { class: `seg ${name}`, title: `${name}: ${tokens}` });
    seg.style.width = `${(100 * tokens) / Math.max(b.budget, used)}%`;
    bar.append(seg);
  }
  const marks = [];
  if (b.history_units_omitted) marks.push(`${b.history_units_omitted} unit(s) left out`);
  if (b.environment_degraded) marks.push("environment shrunk");
  return element("div", { class: "bar-row", "data-iteration": event.iteration },
    element("span", {}, `step ${event.iteration}`), bar, element("span", { class: "marks" }, marks.join(", ")));
}

function describe(event) {
  switch (event.kind) {
    case "text_delta": case "thinking_delta": return JSON.stringify(event.text);
    case "tool_call_started": return `${event.name} ${event.arguments}`;
    case "tool_call_completed": return `${event.name} → ${event.content.slice(0, 120)}`;
    case "tool_call_failed": return `${event.name} ✗ ${event.error}`;
    case "approval_required": return `${event.name}: ${event.reason}`;
    case "approval_resolved": return event.approved ? "approved" : `denied ${event.reason}`;
    case "model_responded": return `${event.source === "summarizer" ? "summary call " : ""}${event.prompt_tokens}+${event.completion_tokens} tokens · ${formatCost(event.cost_usd)}`;
    case "run_finished": return `${event.stop_reason} · ${event.prompt_tokens}+${event.completion_tokens} tokens · ${formatCost(event.cost_usd)}: ${event.final_text.slice(0, 160)}`;
    case "history_pruned": return "history pruned";
    case "context_built": return `${event.breakdown.total}/${event.breakdown.budget} tokens`;
    default: return "";
  }
}

// One refresh at a time; a change seen during one triggers another after it, so the last
// view shown is never older than the last event.
let refreshing = false, again = false;
async function scheduleRefresh() {
  if (refreshing) { again = true; return; }
  refreshing = true;
  try {
    do { again = false; await refresh(); } while (again);
  } finally { refreshing = false; }
}

function onEvent(id, event) {
  if (id !== null) state.lastId = id;
  $("events").append(element("li", { class: event.kind, value: id === null ? "" : String(id) }, `${event.kind} ${describe(event)}`));
  if (event.kind === "context_built") $("budget").append(budgetBar(event));
  if (event.kind === "model_responded") {
    const s = state.spent;
    s.calls += 1; s.tokens += event.prompt_tokens + event.completion_tokens;
    if (event.cost_usd === null || event.cost_usd === undefined) s.unknown = true; else s.usd += event.cost_usd;
    showSpent();
  }
  if (event.kind === "history_pruned") {
    const rows = $("budget").children;
    if (rows.length) rows[rows.length - 1].querySelector(".marks").append(" pruned");
  }
  const card = (callId) => document.querySelector(`.approval[data-call="${CSS.escape(callId)}"]`);
  if (event.kind === "approval_required" && !state.resolved.has(event.call_id) && !card(event.call_id)) {
    $("approvals").append(approvalCard({ call_id: event.call_id, name: event.name, reason: event.reason, arguments: JSON.parse(event.arguments || "{}") }));
  }
  if (event.kind === "approval_resolved") {
    state.resolved.add(event.call_id);
    if (card(event.call_id)) card(event.call_id).remove();
  }
  if (["environment_updated", "plan_updated", "run_finished", "run_started"].includes(event.kind)) scheduleRefresh();
  if (event.kind === "run_finished") loadSessions();
}

async function follow(id) {
  const controller = new AbortController();
  state.abort = controller;
  while (!controller.signal.aborted && state.session === id) {
    try {
      const h = headers("GET");
      if (state.lastId >= 0) h["Last-Event-ID"] = String(state.lastId);
      const response = await fetch(`sessions/${id}/events`, { headers: h, signal: controller.signal });
      if (!response.ok) throw new Error(`stream ${response.status}`);
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          const frame = buffer.slice(0, end); buffer = buffer.slice(end + 2);
          let data = "", frameId = null;
          for (const line of frame.split("\n")) {
            if (line.startsWith("data:")) data += line.slice(5).trimStart();
            else if (line.startsWith("id:")) frameId = Number(line.slice(3).trim());
          }
          if (data) onEvent(frameId, JSON.parse(data));
        }
      }
    } catch (error) {
      if (controller.signal.aborted) return;
    }
    await new Promise((resolve) => setTimeout(resolve, 1000));  // reconnect, resuming after lastId
  }
}

$("new-session").onclick = async () => {
  const view = await api("POST", "sessions", {});
  await openSession(view.id);
};
$("message-form").onsubmit = async (event) => {
  event.preventDefault();
  const text = $("message").value.trim();
  if (!text || !state.session) return;
  $("message").value = "";
  await api("POST", `sessions/${state.session}/messages`, { message: text });
};
$("token").onchange = () => { sessionStorage.setItem("agent_flow_token", $("token").value); loadSessions(); };
loadSessions().catch(() => {});
