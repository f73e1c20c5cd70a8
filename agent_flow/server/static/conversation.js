// The conversation as people read it, built from the session's events (`RunLog` draws each
// run). A delegated child's run is a block of its own under the parent's tool call that made
// it (`RunTree` says which): its run id, task, messages and tool calls, and its end (stop
// reason, tokens, cost) in the block's heading; a grandchild's block sits in its parent's the
// same way, and children running side by side each fill their own block. So the top-level
// conversation holds only the top-level runs' messages: a child's answer never reads as the
// parent's. It follows new messages unless the user scrolled up.
import { Tail, clip, element } from "./dom.js";
import { RunLog, runTotals } from "./runlog.js";
import { RunTree, TOP, shortId } from "./tree.js";

export class Conversation {
  constructor(root, button) {
    this.root = root;
    this.tail = new Tail(root, button, "message");
    this.reset();
  }

  reset() {
    this.root.replaceChildren();
    this.tree = new RunTree();
    this.logs = new Map([[TOP, new RunLog(this.root, (n) => this.tail.grew(n))]]);
    this.blocks = new Map(); // child run key -> { node, state, totals }
    this.tail.reset();
  }

  onEvent(event) {
    const { key, fresh } = this.tree.observe(event);
    for (const run of fresh) this.open(run);
    if (key !== TOP && event.kind === "run_started") this.started(key, event);
    if (key !== TOP && event.kind === "run_finished") this.finished(key, event);
    this.logs.get(key).onEvent(event);
  }

  // A child run's block, under its parent's call.
  open(run) {
    const parent = this.logs.get(run.parent);
    const state = element("span", { class: "pill" }, "running");
    const totals = element("span", { class: "totals" });
    const task = element("span", { class: "task" }, clip(run.task ?? "", 160));
    const body = element("div", { class: "child-body" });
    const node = element("details", { class: "child-run", open: "", "data-run": run.key, "data-call": run.callId, "data-depth": run.depth },
      element("summary", {}, element("span", { class: "who" }, `↳ ${run.name ?? "delegated run"}`), " ",
        element("code", { class: "run-id", title: run.key }, shortId(run.key)), " ", task, " ", state, totals),
      body);
    parent.slotFor(run.callId).append(node);
    this.blocks.set(run.key, { node, state, totals, task });
    this.logs.set(run.key, new RunLog(body, (n) => this.tail.grew(n), { child: true }));
    this.tail.grew(1);
  }

  started(key, event) {
    const block = this.blocks.get(key);
    block.task.textContent = clip(event.task, 160);
    block.node.title = event.task;
  }

  finished(key, event) {
    const block = this.blocks.get(key);
    block.state.textContent = event.stop_reason;
    block.state.className = `pill ${event.stop_reason}`;
    block.totals.textContent = ` ${runTotals(event)}`;
    block.node.classList.add("ended");
  }
}
