// The event list: one row per event, each run of consecutive deltas (text, thinking and
// tool-call argument fragments) folded into one row that opens on demand, and the list
// following new events unless the user scrolled up. A delegated child's events are indented
// one level per run above them (their `path`) and tagged with the child's run id; the
// "top level only" filter hides them (`showChildren`).
import { Tail, clip, element, formatCost } from "./dom.js";
import { depthOf, runKey, shortId } from "./tree.js";

export const DELTAS = new Set(["text_delta", "thinking_delta", "tool_call_arguments_delta"]);

// What a row says after the event's kind.
export function describe(event) {
  switch (event.kind) {
    case "run_started": return JSON.stringify(clip(event.task, 160));
    case "iteration_started": return `step ${event.iteration}`;
    case "text_delta": case "thinking_delta": return JSON.stringify(event.text);
    case "tool_call_arguments_delta": return `${event.name || ""} ${JSON.stringify(event.delta)}`;
    case "tool_call_started": return `${event.name} ${clip(event.arguments, 160)}`;
    case "tool_call_completed": return `${event.name} → ${clip(event.content, 120)}`;
    case "tool_call_failed": return `${event.name} ✗ ${event.error}`;
    case "approval_required": return `${event.name}: ${event.reason}`;
    case "approval_resolved": return event.approved ? `${event.name} approved` : `${event.name} denied ${event.reason}`;
    case "model_responded": return `${event.source === "summarizer" ? "summary call " : ""}${event.prompt_tokens}+${event.completion_tokens} tokens · ${formatCost(event.cost_usd)}`;
    case "run_finished": return `${event.stop_reason} · ${event.prompt_tokens}+${event.completion_tokens} tokens · ${formatCost(event.cost_usd)}: ${clip(event.final_text, 160)}`;
    case "history_pruned": return "history pruned";
    case "context_built": return `${event.breakdown.total}/${event.breakdown.budget} tokens`;
    case "environment_updated": return `${event.source}: ${event.changes.map((c) => c.pointer).join(", ")}`;
    case "plan_updated": return `${event.plan.filter((s) => s.completed).length}/${event.plan.length} done`;
    case "warning_raised": return event.message;
    case "execution_error": return `${event.error_type}: ${event.message}`;
    case "model_retrying": return `attempt ${event.attempt}/${event.max_attempts} in ${event.delay}s: ${event.reason}`;
    case "model_output_discarded": return JSON.stringify(clip(event.text, 120));
    case "events_dropped": return `${event.count} events this page missed`;
    default: return "";
  }
}

// A child's rows carry its depth (the indentation) and its run id; a top-level one's neither.
function tagged(node, event) {
  const depth = depthOf(event);
  if (depth) {
    node.classList.add("child");
    node.dataset.depth = String(depth);
    node.dataset.run = event.run_id;
    node.style.setProperty("--depth", String(depth));
  }
  return node;
}

function row(id, event) {
  const depth = depthOf(event);
  return tagged(element("li", { class: event.kind, "data-id": id },
    element("span", { class: "seq" }, `${depth ? "↳" : "#"}${event.seq}`), " ",
    depth ? element("span", { class: "run-tag", title: event.run_id }, shortId(event.run_id)) : null, depth ? " " : null,
    element("span", { class: "kind" }, event.kind), " ", describe(event)), event);
}

export class EventList {
  constructor(list, button) {
    this.list = list;
    this.tail = new Tail(list, button, "event");
    this.group = null;  // the open delta group: { node, summary, events, run }
  }

  // Show the delegated runs' events (true) or the top-level runs' only (false).
  showChildren(shown) {
    this.list.classList.toggle("top-only", !shown);
  }

  reset() {
    this.list.replaceChildren();
    this.group = null;
    this.tail.reset();
  }

  add(id, event) {
    if (DELTAS.has(event.kind)) this.addDelta(id, event);
    else {
      this.group = null;
      this.list.append(row(id, event));
    }
    this.tail.grew();
  }

  addDelta(id, event) {
    // A group holds one run's deltas: children streaming side by side get a group each.
    if (this.group !== null && this.group.run !== runKey(event)) this.group = null;
    if (this.group === null) {
      const summary = element("summary");
      const rows = element("ol", { class: "delta-rows" });
      const details = element("details", {}, summary, rows);
      const group = { node: tagged(element("li", { class: "deltas", "data-id": id }, details), event), summary, rows, details, events: [], kinds: new Set(), text: "", run: runKey(event) };
      // Rows of the single deltas only once someone opens the group.
      details.addEventListener("toggle", () => {
        if (details.open && rows.childElementCount < group.events.length) {
          rows.replaceChildren(...group.events.map(([eventId, e]) => row(eventId, e)));
        }
      });
      this.group = group;
      this.list.append(group.node);
    }
    const group = this.group;
    group.events.push([id, event]);
    group.kinds.add(event.kind);
    // The summary shows the start of the text: no need to keep more of it.
    if (group.text.length <= 140) group.text += event.kind === "tool_call_arguments_delta" ? event.delta : event.text;
    if (group.details.open) group.rows.append(row(id, event));
    group.summary.textContent = `${group.run ? `↳ ${shortId(group.run)} ` : ""}${group.events.length} deltas (${[...group.kinds].join(", ")}): ${JSON.stringify(clip(group.text, 140))}`;
  }
}
