// One run's conversation as people read it: the model's answers (Markdown, once each answer is
// complete; plain text while it streams), its thinking folded, each tool call folded with its
// arguments and result, notes, and the run's end. The top-level runs of a session share one
// (each opens with the user's message); a delegated child's run has its own, inside its block
// (`Conversation`), opened by its task instead.
import { clip, element, formatCost, number, prettyArguments } from "./dom.js";
import { renderMarkdown } from "./markdown.js";

export class RunLog {
  // `root`: where its nodes go; `grew(added)`: told of each node added (the tail follows);
  // `child`: a delegated run's (no user message; its answer is the sub-task's).
  constructor(root, grew, { child = false } = {}) {
    this.root = root;
    this.grew = grew;
    this.child = child;
    this.turn = null;       // the model's answer being written: { node, text, body, ... }
    this.lastText = "";     // the text of the latest complete answer
    this.calls = new Map(); // call id -> its folded tool call (call ids are per run)
  }

  add(node) {
    this.root.append(node);
    this.grew(1);
    return node;
  }

  note(text, kind = "note") {
    this.add(element("div", { class: `note ${kind}` }, text));
  }

  // The answer being written, made on its first content.
  current(iteration) {
    if (this.turn === null) {
      const body = element("div", { class: "md streaming" });
      const tools = element("div", { class: "tools" });
      const node = element("div", { class: "msg assistant", "data-iteration": iteration ?? "" },
        element("div", { class: "who" }, this.child ? "sub-agent" : "assistant"), body, tools);
      this.turn = { node, body, tools, text: "", thinking: null, live: null };
      this.add(node);
    }
    return this.turn;
  }

  onEvent(event) {
    switch (event.kind) {
      case "run_started":
        this.turn = null;
        if (!this.child) {
          this.add(element("div", { class: "msg user" }, element("div", { class: "who" }, "user"),
            element("div", { class: "text" }, event.task)));
        }
        break;
      case "iteration_started":
        this.turn = null;
        break;
      case "thinking_delta": {
        const turn = this.current();
        if (turn.thinking === null) {
          turn.thinking = document.createTextNode("");
          turn.node.insertBefore(element("details", { class: "thinking" }, element("summary", {}, "thinking"),
            element("div", { class: "text" }, turn.thinking)), turn.body);
        }
        turn.thinking.appendData(event.text);
        break;
      }
      case "text_delta": {
        const turn = this.current();
        if (turn.live === null) { turn.live = document.createTextNode(""); turn.body.append(turn.live); }
        turn.live.appendData(event.text);
        turn.text += event.text;
        this.grew(0);
        break;
      }
      case "model_output_discarded":
        if (this.turn !== null) this.turn.node.remove();
        this.turn = null;
        this.note(`A cut answer was discarded (attempt ${event.attempt}): ${clip(event.text, 80)}`);
        break;
      case "model_retrying":
        this.note(`The model call failed; retrying (attempt ${event.attempt} of ${event.max_attempts}): ${event.reason}`);
        break;
      case "model_responded":
        if (event.source === "agent") this.finishTurn();
        break;
      case "tool_call_started": this.callStarted(event); break;
      case "approval_required": this.callStatus(event.call_id, "waiting for approval", "waiting"); break;
      case "approval_resolved":
        this.callStatus(event.call_id, event.approved ? `approved${event.decided_by ? " by " + event.decided_by : ""}` : `denied ${event.reason}`, event.approved ? "" : "failed");
        break;
      case "tool_call_completed": this.callEnded(event.call_id, event.content, event.is_error, event.duration_ms); break;
      case "tool_call_failed": this.callEnded(event.call_id, event.error, true, event.duration_ms); break;
      case "history_pruned": this.note("Older history was pruned from the prompt to stay within the budget."); break;
      case "warning_raised": this.note(`Warning: ${event.message}`, "warning"); break;
      case "execution_error": this.note(`${event.fatal ? "Fatal error" : "Error"}: ${event.error_type}: ${event.message}`, "error"); break;
      case "events_dropped": this.note(`${event.count} events did not reach this page (it fell behind).`, "warning"); break;
      case "run_finished": this.runFinished(event); break;
      default: break;
    }
  }

  finishTurn() {
    const turn = this.turn;
    if (turn === null) return;
    turn.body.classList.remove("streaming");
    if (turn.text.trim()) {
      turn.body.replaceChildren(renderMarkdown(turn.text));
      this.lastText = turn.text.trim();
    } else {
      turn.body.remove();
    }
    turn.live = null;
    this.grew(0);
  }

  callStarted(event) {
    const turn = this.current();
    const status = element("span", { class: "status" }, "running…");
    const result = element("pre", { class: "result" });
    const node = element("details", { class: "tool", "data-call": event.call_id },
      element("summary", {}, element("span", { class: "tool-name" }, event.name), " ",
        element("code", { class: "args" }, clip(event.arguments, 80)), " ", status),
      element("div", { class: "label" }, "arguments"), element("pre", { class: "arguments" }, prettyArguments(event.arguments)),
      element("div", { class: "label" }, "result"), result);
    turn.tools.append(node);
    this.calls.set(event.call_id, { node, status, result, delegated: null });
    this.grew(0);
  }

  // Where the runs delegated by call `callId` go: right under the call, one block after
  // another (never folded into the call, so that they show while it is closed). Without
  // such a call, after what the run has shown so far.
  slotFor(callId) {
    const call = callId === null ? undefined : this.calls.get(callId);
    if (!call) return this.root;
    if (call.delegated === null) {
      call.delegated = element("div", { class: "delegated", "data-call": callId });
      call.node.after(call.delegated);
    }
    return call.delegated;
  }

  callStatus(callId, text, kind) {
    const call = this.calls.get(callId);
    if (!call) return;
    call.status.textContent = text;
    call.status.className = `status ${kind}`;
  }

  callEnded(callId, content, failed, durationMs) {
    const call = this.calls.get(callId);
    if (!call) return;
    call.result.textContent = content;
    call.node.classList.toggle("failed", failed);
    this.callStatus(callId, `${failed ? "✗" : "✓"} ${Math.round(durationMs)} ms`, failed ? "failed" : "done");
  }

  runFinished(event) {
    this.finishTurn();
    this.turn = null;
    const final = (event.final_text || "").trim();
    if (final && final !== this.lastText) {
      this.add(element("div", { class: "msg assistant answer" }, element("div", { class: "who" }, this.child ? "sub-task answer" : "answer"),
        element("div", { class: "md" }, renderMarkdown(final))));
      this.lastText = final;
    }
    // A delegated run's end is in its block's heading (`Conversation`), shown while folded.
    if (this.child) return;
    this.add(element("div", { class: `run-end ${event.stop_reason}` },
      element("span", { class: "pill" }, event.stop_reason), ` ${runTotals(event)}`));
  }
}

// A run's end after its stop reason: steps, tokens, cost.
export function runTotals(event) {
  const steps = `after ${event.iterations} step${event.iterations === 1 ? "" : "s"}`;
  return `${steps} · ${number(event.prompt_tokens + event.completion_tokens)} tokens · ${formatCost(event.cost_usd)}`;
}
