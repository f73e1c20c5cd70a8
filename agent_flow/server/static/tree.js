// Delegated runs as a tree: which run an event belongs to, and under which of its parent's
// tool calls a delegated child's run goes. Built from each event's `path` (the run ids above
// it, outermost first; empty at the top level) and `run_id` alone, never from its seq or id,
// so events read from the store and events arriving live place the same, in whatever order
// the stream interleaves the events of children running side by side.
//
// A child's run starts while its parent's delegating tool call runs (between the call's
// tool_call_started and its end) and is given the call's `task` argument: a child is placed
// under the first call of its parent still running, not yet given a child, whose task is the
// child's; failing that (its run_started was missed) under the first such call with any task.
// Two calls with the same task running at once cannot be told apart by their events: their
// children may swap places, both still under a call with that very task.

// The key of the top-level runs: one conversation, run after run.
export const TOP = "";

// The key of the run `event` belongs to: its run id for a delegated child's, else TOP.
export function runKey(event) {
  return event.path && event.path.length ? event.run_id : TOP;
}

// How many runs `event`'s run was delegated from (0 at the top level).
export const depthOf = (event) => (event.path ? event.path.length : 0);

// A run id as the CLI's trace view shows it.
export const shortId = (runId) => String(runId ?? "").slice(0, 8);

// The `task` argument of a tool call's arguments (JSON text), or null.
export function taskOf(args) {
  try {
    const value = JSON.parse(args);
    return value !== null && typeof value === "object" && typeof value.task === "string" ? value.task : null;
  } catch {
    return null;
  }
}

export class RunTree {
  constructor() { this.reset(); }

  reset() {
    this.runs = new Map();   // child run key -> { key, parent, callId, name, task, depth }
    this.open = new Map();   // run key -> its running tool calls: [{ callId, name, task, child }]
  }

  // Note `event`; returns its run's key and the child runs first seen with it, outermost first
  // (its own, and those between it and the top level when their events were missed), each
  // with where it goes (`parent` key, `callId` or null when no running call fits).
  observe(event) {
    const key = runKey(event);
    const fresh = [];
    if (key !== TOP) this.place(event.path, key, event.kind === "run_started" ? event.task : null, fresh);
    if (event.kind === "tool_call_started") {
      if (!this.open.has(key)) this.open.set(key, []);
      this.open.get(key).push({ callId: event.call_id, name: event.name, task: taskOf(event.arguments), child: null });
    } else if (event.kind === "tool_call_completed" || event.kind === "tool_call_failed") {
      const calls = this.open.get(key) || [];
      const at = calls.findIndex((c) => c.callId === event.call_id);
      if (at >= 0) calls.splice(at, 1);
    }
    return { key, fresh };
  }

  place(path, key, task, fresh) {
    if (this.runs.has(key)) return;
    const parent = path.length > 1 ? path[path.length - 1] : TOP;
    if (parent !== TOP) this.place(path.slice(0, -1), parent, null, fresh);
    const free = (this.open.get(parent) || []).filter((c) => c.child === null);
    const call = free.find((c) => task !== null && c.task === task) || free.find((c) => c.task !== null) || null;
    if (call !== null) call.child = key;
    const run = { key, parent, callId: call && call.callId, name: call && call.name, task: task ?? call?.task ?? null, depth: path.length };
    this.runs.set(key, run);
    fresh.push(run);
  }
}
