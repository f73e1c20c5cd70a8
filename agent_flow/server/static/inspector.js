// The agent_flow inspector: sessions; for one session its conversation, the token budget and
// prompt of every step with the environment's changes, the environment tree and plan, the live
// event list, pending approvals and a message box; a delegated child's run nested under the
// parent's call that made it (`tree.js`). Plain JS modules, no build step, no CDN.
// The event stream is read with fetch (not EventSource) so that a bearer token can go in the
// Authorization header; it resumes after the last event id it received.
import { $, element, formatCost } from "./dom.js";
import { Conversation } from "./conversation.js";
import { NewSessionDialog } from "./dialog.js";
import { EventList } from "./events.js";
import { Steps } from "./steps.js";

// `resolved` holds answered call ids: a session view fetched before the answer must not bring
// its card back, and an event must not add a card a view already added.
const state = { session: null, lastId: -1, abort: null, env: {}, oldEnv: {}, resolved: new Set(), spent: newSpent(), tab: "steps" };

// The session's model calls so far, summed from its events: tokens, and dollars while every
// call had a known price (one unknown price makes the total unknown, never a smaller sum).
function newSpent() { return { calls: 0, tokens: 0, usd: 0, unknown: false }; }

function showSpent() {
  const s = state.spent;
  $("session-cost").textContent = `${s.calls} model calls · ${s.tokens} tokens · ${formatCost(s.unknown ? null : s.usd)}`;
}

// `agent-flow serve` prints the page's address with its token after "#token=": the fragment
// never leaves the browser (no server log, no Referer). Keep it for this tab, then drop it
// from the address bar. "#session=ID" opens that session.
const fragment = new URLSearchParams(location.hash.slice(1));
if (fragment.get("token")) sessionStorage.setItem("agent_flow_token", fragment.get("token"));
const firstSession = fragment.get("session");
history.replaceState(null, "", location.pathname + location.search + (firstSession ? `#session=${encodeURIComponent(firstSession)}` : ""));

function headers(method) {
  const h = {};
  const token = sessionStorage.getItem("agent_flow_token");
  if (token) h["Authorization"] = "Bearer " + token;
  // Every POST is JSON, an empty one too: a server without tokens refuses other POSTs.
  if (method !== "GET") h["Content-Type"] = "application/json";
  return h;
}

class NeedToken extends Error {}

function askForToken() {
  const refused = sessionStorage.getItem("agent_flow_token") !== null;
  $("token-refused").hidden = !refused;
  $("token-box").hidden = false;
  document.body.classList.add("locked");
}

async function api(method, path, body) {
  const response = await fetch(path, {
    method, headers: headers(method),
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (response.status === 401) { askForToken(); throw new NeedToken("this server needs a token"); }
  if (!response.ok && response.status !== 204) {
    const error = await response.json().catch(() => ({ message: response.statusText }));
    throw new Error(error.message);
  }
  return response.status === 204 ? null : response.json();
}

const events = new EventList($("events"), $("events-more"));
const conversation = new Conversation($("conversation"), $("conversation-more"));
const steps = new Steps($("budget"), $("step-detail"),
  (eventId) => api("GET", `sessions/${encodeURIComponent(state.session)}/prompts/${eventId}`),
  () => state.tab === "steps");

async function loadSessions() {
  const { sessions } = await api("GET", "sessions");
  $("token-box").hidden = true;
  document.body.classList.remove("locked");
  const list = $("sessions");
  list.replaceChildren(...sessions.map((s) => {
    const item = element("li", { "data-id": s.id }, s.title || s.id,
      element("small", {}, element("span", { class: `pill ${s.status}` }, s.status), s.running ? " · running" : ""));
    if (state.session === s.id) item.classList.add("selected");
    item.onclick = () => openSession(s.id);
    return item;
  }));
  return sessions;
}

async function openSession(id) {
  if (state.abort) state.abort.abort();
  Object.assign(state, { session: id, lastId: -1, env: {}, oldEnv: {}, resolved: new Set(), spent: newSpent() });
  history.replaceState(null, "", `${location.pathname}${location.search}#session=${encodeURIComponent(id)}`);
  showSpent();
  $("session-pane").hidden = false;
  $("approvals").replaceChildren();
  events.reset(); conversation.reset(); steps.reset();
  await refresh();
  await loadSessions();
  follow(id);
}

async function refresh() {
  const view = await api("GET", `sessions/${encodeURIComponent(state.session)}`);
  $("session-title").textContent = view.title || view.id;
  const task = (view.environment.task && view.environment.task.status) || "not_started";
  $("status-pill").textContent = view.status;
  $("status-pill").className = `pill ${view.status}`;
  $("task-status").textContent = task;
  $("task-status").className = `pill ${task}`;
  $("run-state").textContent = view.state;
  $("history-size").textContent = `${view.history.entries} history entries, ${view.history.tokens} tokens`;
  steps.running = view.state === "running";
  state.oldEnv = state.env; state.env = view.environment;
  $("environment").replaceChildren(tree(view.environment, state.oldEnv, ""));
  const plan = (view.environment.task && view.environment.task.plan) || [];
  $("plan").replaceChildren(...plan.map((step) => element("li", { class: step.completed ? "done" : "" }, step.description)));
  $("no-plan").hidden = plan.length > 0;
  // The view may be older than the events: a card an `approval_required` event added after
  // this view was read stays (and one shown already is kept, not rebuilt under the pointer).
  const pending = view.pending_approvals.filter((a) => !state.resolved.has(a.call_id));
  const shown = new Map([...$("approvals").children].map((card) => [card.dataset.call, card]));
  const listed = new Set(pending.map((a) => a.call_id));
  const newer = [...shown.values()].filter((card) => !listed.has(card.dataset.call) && !state.resolved.has(card.dataset.call));
  $("approvals").replaceChildren(...pending.map((a) => shown.get(a.call_id) || approvalCard(a)), ...newer);
}

function tree(value, old, path) {
  if (value === null || typeof value !== "object") {
    const text = element("span", { class: "value" }, JSON.stringify(value));
    if (JSON.stringify(value) !== JSON.stringify(old)) text.classList.add("changed");
    return text;
  }
  if (Object.keys(value).length === 0) {
    return element("span", { class: "value empty" }, Array.isArray(value) ? "[]" : "{}");
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
    await api("POST", `sessions/${encodeURIComponent(state.session)}/approvals/${encodeURIComponent(approval.call_id)}`, { approved });
  };
  approve.onclick = answer(true); deny.onclick = answer(false);
  return card;
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
  events.add(id, event);
  conversation.onEvent(event);
  steps.onEvent(id, event);
  if (event.kind === "run_started" && !(event.path && event.path.length)) steps.running = true;
  if (event.kind === "model_responded") {
    const s = state.spent;
    s.calls += 1; s.tokens += event.prompt_tokens + event.completion_tokens;
    if (event.cost_usd === null || event.cost_usd === undefined) s.unknown = true; else s.usd += event.cost_usd;
    showSpent();
  }
  const card = (callId) => document.querySelector(`.approval[data-call="${CSS.escape(callId)}"]`);
  if (event.kind === "approval_required" && !state.resolved.has(event.call_id) && !card(event.call_id)) {
    let args = {};
    try { args = JSON.parse(event.arguments || "{}"); } catch { args = { arguments: event.arguments }; }
    $("approvals").append(approvalCard({ call_id: event.call_id, name: event.name, reason: event.reason, arguments: args }));
  }
  if (event.kind === "approval_resolved") {
    state.resolved.add(event.call_id);
    if (card(event.call_id)) card(event.call_id).remove();
  }
  // A delegated child's run is not the session's: its start, end and environment change
  // neither the session's state nor its view.
  if (event.path && event.path.length) return;
  if (["environment_updated", "plan_updated", "run_finished", "run_started"].includes(event.kind)) scheduleRefresh();
  if (event.kind === "run_finished") { steps.running = false; loadSessions(); }
}

async function follow(id) {
  const controller = new AbortController();
  state.abort = controller;
  while (!controller.signal.aborted && state.session === id) {
    try {
      const h = headers("GET");
      if (state.lastId >= 0) h["Last-Event-ID"] = String(state.lastId);
      const response = await fetch(`sessions/${encodeURIComponent(id)}/events`, { headers: h, signal: controller.signal });
      if (response.status === 401) askForToken();
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

function showTab(name) {
  state.tab = name;
  for (const button of document.querySelectorAll(".tab")) button.setAttribute("aria-selected", String(button.dataset.tab === name));
  for (const pane of document.querySelectorAll(".tab-pane")) pane.hidden = pane.id !== `pane-${name}`;
  if (name === "steps") steps.shown();
  if (name === "events") events.tail.jump();
}
for (const button of document.querySelectorAll(".tab")) button.onclick = () => showTab(button.dataset.tab);
$("events-top-only").onchange = () => events.showChildren(!$("events-top-only").checked);

const dialog = new NewSessionDialog(api, (view) => openSession(view.id));
$("new-session").onclick = () => dialog.open();
$("message-form").onsubmit = async (event) => {
  event.preventDefault();
  const text = $("message").value.trim();
  if (!text || !state.session) return;
  $("message").value = "";
  try {
    await api("POST", `sessions/${encodeURIComponent(state.session)}/messages`, { message: text });
    $("message-error").hidden = true;
  } catch (error) {
    $("message").value = text;
    $("message-error").textContent = error.message;
    $("message-error").hidden = false;
  }
};
$("message").onkeydown = (event) => {
  if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) $("message-form").requestSubmit();
};
$("token-form").onsubmit = async (event) => {
  event.preventDefault();
  sessionStorage.setItem("agent_flow_token", $("token").value.trim());
  $("token").value = "";
  await start();
};

async function start() {
  try {
    const sessions = await loadSessions();
    if (firstSession && state.session === null && sessions.some((s) => s.id === firstSession)) await openSession(firstSession);
  } catch (error) {
    if (!(error instanceof NeedToken)) throw error;
  }
}
showTab("steps");
start();
