// Per step, what the model saw: a stacked bar of the token budget per step (from each
// `context_built` event), and for the selected step the prompt as sent (every message with its
// tokens, the environment's part of the system message marked) and the environment's changes
// since the previous step (from the `environment_updated` events in between). A delegated
// child's steps are a block of their own under the parent's step that delegated it (`RunTree`
// says where), with its run id, task and end; a grandchild's sit in its parent's block.
import { clip, element, number } from "./dom.js";
import { runTotals } from "./runlog.js";
import { RunTree, TOP, shortId } from "./tree.js";

const SECTIONS = [
  ["system", "system prompt", (b) => b.system_template + b.priming],
  ["environment", "environment", (b) => b.environment],
  ["tools", "tool schemas", (b) => b.tools],
  ["history", "history", (b) => b.history],
  ["reserve", "reserved for the answer", (b) => b.reserve],
];

export function budgetBar(breakdown) {
  const parts = SECTIONS.map(([name, , of]) => [name, of(breakdown)]);
  const used = parts.reduce((sum, [, n]) => sum + n, 0);
  parts.push(["free", Math.max(0, breakdown.budget - used)]);
  const bar = element("div", { class: "bar", title: `${breakdown.total} of ${breakdown.budget} tokens` });
  for (const [name, tokens] of parts) {
    const seg = element("span", { class: `seg ${name}`, title: `${name}: ${tokens}` });
    seg.style.width = `${(100 * tokens) / Math.max(breakdown.budget, used)}%`;
    bar.append(seg);
  }
  return bar;
}

function marks(breakdown) {
  const found = [];
  if (breakdown.history_units_omitted) found.push(`${breakdown.history_units_omitted} unit(s) left out`);
  if (breakdown.environment_degraded) found.push("environment shrunk");
  return found.join(", ");
}

const json = (value) => (value === undefined ? "—" : clip(JSON.stringify(value), 160));

export class Steps {
  // `fetchPrompt(eventId)` resolves to a PromptView or rejects with the server's message.
  constructor(bars, detail, fetchPrompt, isVisible) {
    this.bars = bars;
    this.detail = detail;
    this.fetchPrompt = fetchPrompt;
    this.isVisible = isVisible;
    this.reset();
  }

  reset() {
    this.bars.replaceChildren();
    this.detail.replaceChildren(element("p", { class: "hint" }, "No step yet: the budget of each step appears here as the agent works."));
    this.steps = [];
    this.byId = new Map();
    this.runs = new Map();
    this.tree = new RunTree();
    // Per run (TOP: the session's own): its steps, and the changes since its latest one.
    this.lanes = new Map([[TOP, { key: TOP, steps: this.steps, changes: [] }]]);
    this.childSteps = 0;
    this.selected = null;
    this.pinned = false;
    this.running = false;
  }

  onEvent(id, event) {
    const { key, fresh } = this.tree.observe(event);
    for (const run of fresh) this.openLane(run);
    const lane = this.lanes.get(key);
    if (event.kind === "environment_updated") {
      for (const change of event.changes) lane.changes.push({ ...change, source: event.source });
      const last = lane.steps[lane.steps.length - 1];
      if (last && this.selected === last.id) this.renderChanges();
    } else if (event.kind === "history_pruned") {
      const last = lane.steps[lane.steps.length - 1];
      if (last) last.row.querySelector(".marks").append(" pruned");
    } else if (event.kind === "context_built" && key !== TOP) {
      this.addChildStep(id, event, lane);
    } else if (event.kind === "context_built" && id !== null) {
      this.addStep(id, event);
    } else if (key !== TOP && event.kind === "run_started") {
      lane.task.textContent = clip(event.task, 120);
    } else if (key !== TOP && event.kind === "run_finished") {
      lane.state.textContent = event.stop_reason;
      lane.state.className = `pill ${event.stop_reason}`;
      lane.totals.textContent = ` ${runTotals(event)}`;
    }
  }

  // A delegated run's block, under the latest step of its parent (the one that delegated it).
  openLane(run) {
    const parent = this.lanes.get(run.parent);
    const last = parent.steps[parent.steps.length - 1];
    const body = element("div", { class: "child-body" });
    const state = element("span", { class: "pill" }, "running");
    const totals = element("span", { class: "totals" });
    const task = element("span", { class: "task" }, clip(run.task ?? "", 120));
    const node = element("details", { class: "child-steps", open: "", "data-run": run.key, "data-depth": run.depth },
      element("summary", {}, `↳ ${run.name ?? "delegated run"} `, element("code", { class: "run-id", title: run.key }, shortId(run.key)),
        " ", task, " ", state, totals),
      body);
    if (last) {
      if (!last.children) { last.children = element("div", { class: "step-children" }); last.row.after(last.children); }
      last.children.append(node);
    } else {
      (parent.body || this.bars).append(node);
    }
    this.lanes.set(run.key, { key: run.key, run, steps: [], changes: [], body, state, totals, task });
  }

  addChildStep(id, event, lane) {
    const key = `child-${++this.childSteps}`;
    const row = element("div", { class: "bar-row child", "data-iteration": event.iteration, "data-event-id": id ?? "", "data-run": lane.key, role: "button", tabindex: "0" },
      element("span", { class: "label" }, `step ${event.iteration}`), budgetBar(event.breakdown),
      element("span", { class: "marks" }, marks(event.breakdown)));
    const step = { id: key, event, row, lane, changes: lane.changes, prompt: null };
    lane.changes = [];
    lane.steps.push(step);
    row.onclick = () => { this.pinned = true; this.select(key); };
    row.onkeydown = (e) => { if (e.key === "Enter") row.onclick(); };
    this.byId.set(key, step);
    lane.body.append(row);
  }

  latestId() { return this.steps.length ? this.steps[this.steps.length - 1].id : null; }

  addStep(id, event) {
    if (!this.runs.has(event.run_id)) {
      this.runs.set(event.run_id, this.runs.size + 1);
      this.bars.append(element("div", { class: "run-divider" }, `run ${this.runs.size}`));
    }
    const row = element("div", { class: "bar-row", "data-iteration": event.iteration, "data-event-id": id, role: "button", tabindex: "0" },
      element("span", { class: "label" }, `step ${event.iteration}`), budgetBar(event.breakdown),
      element("span", { class: "marks" }, marks(event.breakdown)));
    const lane = this.lanes.get(TOP);
    const step = { id, event, row, lane, changes: lane.changes, run: this.runs.get(event.run_id), prompt: null };
    lane.changes = [];
    row.onclick = () => { this.pinned = step.id !== this.latestId(); this.select(step.id); };
    row.onkeydown = (e) => { if (e.key === "Enter") row.onclick(); };
    this.steps.push(step);
    this.byId.set(id, step);
    this.bars.append(row);
    if (!this.pinned) this.select(id);
  }

  // Render the selected step again when the steps pane becomes visible.
  shown() { if (this.selected !== null) this.select(this.selected); }

  select(id) {
    const step = this.byId.get(id);
    if (!step) return;
    this.selected = id;
    for (const each of this.byId.values()) each.row.classList.toggle("selected", each.id === id);
    if (!this.isVisible()) return;
    const b = step.event.breakdown;
    const used = SECTIONS.reduce((sum, [, , of]) => sum + of(b), 0);
    const table = element("table", { class: "sections" },
      ...SECTIONS.map(([name, label, of]) => element("tr", { class: name },
        element("td", {}, element("span", { class: `swatch seg ${name}` }), label, this.sectionNote(name, b)),
        element("td", { class: "n" }, number(of(b))))),
      element("tr", { class: "free" }, element("td", {}, element("span", { class: "swatch seg free" }), "free"),
        element("td", { class: "n" }, number(Math.max(0, b.budget - used)))),
      element("tr", { class: "total" }, element("td", {}, "sent to the model"), element("td", { class: "n" }, number(b.total))));
    this.changeList = element("ul", { class: "env-diff" });
    this.promptBox = element("div", { class: "prompt" }, element("p", { class: "hint" }, "loading the prompt…"));
    this.detail.replaceChildren(
      element("h4", { class: "step-title" }, `Step ${step.event.iteration} of ${this.runName(step)} · ${number(b.total)} of ${number(b.budget)} tokens`),
      table,
      element("h4", {}, "Environment changes since the previous step"), this.changeList,
      element("h4", {}, "Prompt as sent"), this.promptBox);
    this.renderChanges();
    if (step.lane.key === TOP) this.loadPrompt(step, 0);
    else this.promptBox.replaceChildren(element("p", { class: "not-kept" }, "The inspector keeps the prompts of the session's own model calls; a delegated run calls its Delegate's model, whose prompts it does not see. The counts above are this step's."));
  }

  runName(step) {
    if (step.lane.key === TOP) return `run ${step.run}`;
    const run = step.lane.run;
    return `delegated run ${shortId(run.key)}${run.name ? ` (${run.name})` : ""}`;
  }

  sectionNote(name, b) {
    if (name === "system" && b.priming) return element("small", {}, ` (template ${number(b.system_template)} + reply priming ${number(b.priming)})`);
    if (name === "environment" && b.environment_degraded) return element("small", {}, " (shrunk to fit its share)");
    if (name === "history") return element("small", {}, ` (${b.history_units_sent} units sent${b.history_units_omitted ? `, ${b.history_units_omitted} left out` : ""})`);
    return null;
  }

  renderChanges() {
    const step = this.byId.get(this.selected);
    if (!step || !this.changeList) return;
    const lane = step.lane;
    const began = lane.key === TOP ? "the session began" : "the sub-task began";
    const items = step.changes.map((c) => this.changeItem(c));
    if (!items.length) items.push(element("li", { class: "hint" }, step === lane.steps[0] ? `none since ${began}` : "none: the environment did not change"));
    if (step === lane.steps[lane.steps.length - 1] && lane.changes.length) {
      items.push(element("li", { class: "after" }, `after this step (in the next prompt): ${lane.changes.length} change${lane.changes.length === 1 ? "" : "s"}`));
      items.push(...lane.changes.map((c) => this.changeItem(c, "after")));
    }
    this.changeList.replaceChildren(...items);
  }

  changeItem(change, kind = "") {
    const what = change.op === "delete"
      ? [element("span", { class: "old" }, json(change.old)), " deleted"]
      : [element("span", { class: "old" }, json(change.old ?? undefined)), " → ", element("span", { class: "new" }, json(change.new))];
    return element("li", { class: kind, "data-pointer": change.pointer },
      element("code", {}, change.pointer), " ", ...what, element("small", {}, ` (${change.source})`));
  }

  async loadPrompt(step, attempt) {
    const box = this.promptBox;
    try {
      step.prompt = step.prompt || await this.fetchPrompt(step.id);
    } catch (error) {
      // The latest step's prompt is kept as its model call starts, a moment after the event.
      if (this.running && step.id === this.latestId() && attempt < 3) {
        setTimeout(() => { if (this.promptBox === box) this.loadPrompt(step, attempt + 1); }, 300);
        return;
      }
      if (this.promptBox === box) box.replaceChildren(element("p", { class: "not-kept" }, error.message));
      return;
    }
    if (this.promptBox === box) box.replaceChildren(...this.renderPrompt(step.prompt));
  }

  renderPrompt(prompt) {
    const b = prompt.breakdown;
    const nodes = prompt.messages.map((message, index) => {
      const body = element("pre", { class: "content" });
      const env = message.environment;
      const at = env ? message.content.indexOf(env) : -1;
      if (at >= 0) {
        body.append(message.content.slice(0, at),
          element("mark", { class: "env", title: `the environment: ${b.environment} tokens` }, env),
          message.content.slice(at + env.length));
      } else {
        body.append(message.content);
      }
      for (const call of message.tool_calls) {
        body.append(element("span", { class: "call" }, `\n→ ${call.name}(${call.arguments})  [${call.id}]`));
      }
      const who = message.role === "tool" ? `tool ${message.name || ""} (${message.tool_call_id || ""})` : message.role;
      const parts = at < 0 ? "" : env === message.content ? " · the environment"
        : ` · template ${number(b.system_template)}, environment ${number(b.environment)}`;
      return element("details", { class: `prompt-message ${message.role}`, "data-index": index, open: index === 0 && at >= 0 ? "" : null },
        element("summary", {}, element("span", { class: "role" }, who), " ",
          element("span", { class: "tokens" }, `${number(message.tokens)} tokens${parts}`), " ",
          element("span", { class: "preview" }, clip(message.content || message.tool_calls.map((c) => c.name).join(", "), 90))),
        body);
    });
    nodes.push(element("p", { class: "offered" }, `Tools offered (${number(b.tools)} tokens, ${prompt.format} format): ${prompt.tools.join(", ") || "none"}`));
    return nodes;
  }
}
