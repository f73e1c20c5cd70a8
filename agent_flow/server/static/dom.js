// Small DOM helpers the inspector's modules share. Text always goes in as text nodes (never
// as HTML), so nothing a model, a tool or a user wrote can become markup.

export const $ = (id) => document.getElementById(id);

// element("li", { class: "x", "data-id": 3 }, "text", child, ...): attributes set as strings,
// children appended as nodes or text; null and undefined children are skipped.
export function element(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.className = value; else node.setAttribute(key, String(value));
  }
  for (const child of children) {
    if (child !== null && child !== undefined) node.append(child);
  }
  return node;
}

// As the terminal shows a cost: "$0.0123", "$1.20", or "cost unknown" (never "$0" for it).
export function formatCost(usd) {
  if (usd === null || usd === undefined) return "cost unknown";
  if (usd === 0 || usd >= 0.01) return "$" + usd.toFixed(2);
  return "$" + usd.toFixed(6).replace(/0+$/, "");
}

export const number = (n) => Number(n).toLocaleString("en-US");

// The first `limit` characters of `text`, with an ellipsis when cut.
export function clip(text, limit) {
  const value = String(text ?? "");
  return value.length > limit ? value.slice(0, limit - 1) + "…" : value;
}

// A tool call's arguments as indented JSON when they parse, else as the model wrote them.
export function prettyArguments(raw) {
  try { return JSON.stringify(JSON.parse(raw), null, 2); } catch { return String(raw ?? ""); }
}

// Follow the tail of a scrolling list: keep it scrolled to the end as content arrives, unless
// the user scrolled up; then count what arrived below and offer a button back to the end.
// Scrolling happens once per animation frame, so a burst of events costs one layout.
export class Tail {
  constructor(scroller, button, noun) {
    this.scroller = scroller;
    this.button = button;
    this.noun = noun;
    this.following = true;
    this.unseen = 0;
    this.lastTop = 0;
    this.pending = false;
    scroller.addEventListener("scroll", () => {
      const top = scroller.scrollTop;
      // Only a move up is the user's: content growing below never lowers scrollTop.
      if (top < this.lastTop - 2) this.following = false;
      if (this.atEnd()) { this.following = true; this.unseen = 0; }
      this.lastTop = top;
      this.show();
    });
    button.addEventListener("click", () => this.jump());
  }

  atEnd() {
    const s = this.scroller;
    return s.scrollHeight - s.scrollTop - s.clientHeight < 4;
  }

  // Something was appended (`added` new items): follow it, or count it.
  grew(added = 1) {
    if (!this.following) { this.unseen += added; this.show(); return; }
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => {
      this.pending = false;
      if (this.following) this.end();
    });
  }

  end() {
    const s = this.scroller;
    s.scrollTop = s.scrollHeight;
    this.lastTop = s.scrollTop;
  }

  jump() {
    this.following = true;
    this.unseen = 0;
    this.end();
    this.show();
  }

  reset() {
    this.following = true;
    this.unseen = 0;
    this.lastTop = 0;
    this.show();
  }

  show() {
    const waiting = !this.following && this.unseen > 0;
    this.button.hidden = !waiting;
    if (waiting) this.button.textContent = `↓ ${this.unseen} new ${this.noun}${this.unseen === 1 ? "" : "s"}`;
  }
}
