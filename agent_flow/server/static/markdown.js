// A small, safe Markdown renderer for the model's answers: it builds DOM nodes and puts every
// piece of text in as a text node, so no input can become markup (no innerHTML anywhere).
// Links keep only http(s) and mailto addresses; anything else stays text.
//
// Blocks: paragraphs, ATX headings, fenced code, block quotes, bullet and numbered lists
// (nested by indentation), pipe tables, rules. Inline: `code`, **strong**, *em* / _em_,
// ~~strike~~, [text](url), <url>, backslash escapes, and hard breaks (two trailing spaces).

const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)[^`]*$/;
const HEADING = /^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$/;
const RULE = /^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$/;
const QUOTE = /^ {0,3}> ?(.*)$/;
const ITEM = /^( *)([-*+]|\d{1,9}[.)])[ \t]+(.*)$/;
const TABLE_RULE = /^ *\|? *:?-+:? *(\| *:?-+:? *)*\|? *$/;
const SAFE_URL = /^(https?:\/\/|mailto:)/i;
// The characters an inline span can start with.
const SPECIAL = new Set(["\\", "`", "*", "_", "~", "[", "<"]);

function node(tag, ...children) {
  const el = document.createElement(tag);
  for (const child of children) el.append(child);
  return el;
}

// Render `text` as Markdown into a new DocumentFragment.
export function renderMarkdown(text) {
  const fragment = document.createDocumentFragment();
  const lines = String(text ?? "").replace(/\r\n?/g, "\n").split("\n");
  blocks(lines, fragment, 0);
  return fragment;
}

const isBlank = (line) => line.trim() === "";

function startsBlock(line) {
  return FENCE.test(line) || HEADING.test(line) || RULE.test(line) || QUOTE.test(line) || ITEM.test(line);
}

// Nested block quotes and lists recurse; past this depth the rest is shown as plain text.
const MAX_DEPTH = 16;

function blocks(lines, parent, depth) {
  if (depth > MAX_DEPTH) {
    parent.append(node("p", lines.join("\n")));
    return;
  }
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    if (isBlank(line)) { i += 1; continue; }
    let match;
    if ((match = FENCE.exec(line))) {
      const fence = match[1];
      const code = [];
      i += 1;
      while (i < lines.length && !(lines[i].trim().startsWith(fence) && lines[i].trim().replace(/[`~]/g, "") === "")) {
        code.push(lines[i]);
        i += 1;
      }
      i += 1;  // the closing fence (or the end)
      const codeNode = node("code", code.join("\n"));
      if (match[2]) codeNode.dataset.language = match[2];
      parent.append(node("pre", codeNode));
      continue;
    }
    if ((match = HEADING.exec(line))) {
      const heading = node(`h${match[1].length}`);
      inline(match[2] || "", heading);
      parent.append(heading);
      i += 1;
      continue;
    }
    if (RULE.test(line)) { parent.append(node("hr")); i += 1; continue; }
    if (QUOTE.test(line)) {
      const quoted = [];
      while (i < lines.length && QUOTE.test(lines[i])) { quoted.push(QUOTE.exec(lines[i])[1]); i += 1; }
      const quote = node("blockquote");
      blocks(quoted, quote, depth + 1);
      parent.append(quote);
      continue;
    }
    if (ITEM.test(line)) { i = list(lines, i, parent, depth); continue; }
    if (i + 1 < lines.length && line.includes("|") && TABLE_RULE.test(lines[i + 1]) && lines[i + 1].includes("-")) {
      i = table(lines, i, parent);
      continue;
    }
    const paragraph = [];
    while (i < lines.length && !isBlank(lines[i]) && (paragraph.length === 0 || !startsBlock(lines[i]))) {
      paragraph.push(lines[i]);
      i += 1;
    }
    const p = node("p");
    paragraph.forEach((text, index) => {
      const last = index === paragraph.length - 1;
      inline(last ? text.trim() : text.replace(/^\s+/, ""), p);
      if (!last) p.append(/ {2,}$/.test(text) ? node("br") : " ");
    });
    parent.append(p);
  }
}

// A list from line `i`: items at its indentation, each item's further lines (indented past
// its marker) rendered as blocks inside it. Returns the index after the list.
function list(lines, i, parent, depth) {
  const first = ITEM.exec(lines[i]);
  const indent = first[1].length;
  const ordered = /\d/.test(first[2]);
  const container = node(ordered ? "ol" : "ul");
  if (ordered && parseInt(first[2], 10) !== 1) container.setAttribute("start", String(parseInt(first[2], 10)));
  while (i < lines.length) {
    const match = ITEM.exec(lines[i]);
    if (!match || match[1].length !== indent || /\d/.test(match[2]) !== ordered) break;
    const body = [match[3]];
    const inner = indent + match[2].length + 1;
    i += 1;
    while (i < lines.length) {
      const line = lines[i];
      const more = ITEM.exec(line);
      if (more && more[1].length <= indent) break;
      if (isBlank(line)) {
        // A blank line ends the list unless the next line goes on inside this item.
        const next = lines[i + 1];
        if (next === undefined || next.search(/\S/) < inner) break;
      } else if (line.search(/\S/) < inner && !more && startsBlock(line)) {
        break;
      }
      body.push(line.slice(Math.min(inner, line.search(/\S|$/))));
      i += 1;
    }
    const item = node("li");
    if (body.length === 1 || body.slice(1).every((line) => !startsBlock(line) && !isBlank(line))) {
      inline(body.map((line) => line.trim()).join(" "), item);
    } else {
      blocks(body, item, depth + 1);
    }
    container.append(item);
  }
  parent.append(container);
  return i;
}

function cells(line) {
  let text = line.trim();
  if (text.startsWith("|")) text = text.slice(1);
  if (text.endsWith("|") && !text.endsWith("\\|")) text = text.slice(0, -1);
  return text.split(/(?<!\\)\|/).map((cell) => cell.trim());
}

function table(lines, i, parent) {
  const head = cells(lines[i]);
  const tableNode = node("table");
  const headRow = node("tr");
  for (const cell of head) { const th = node("th"); inline(cell, th); headRow.append(th); }
  tableNode.append(node("thead", headRow));
  const body = node("tbody");
  i += 2;
  while (i < lines.length && !isBlank(lines[i]) && lines[i].includes("|")) {
    const row = node("tr");
    const values = cells(lines[i]);
    head.forEach((_, index) => { const td = node("td"); inline(values[index] || "", td); row.append(td); });
    body.append(row);
    i += 1;
  }
  tableNode.append(body);
  parent.append(tableNode);
  return i;
}

// Inline spans of `text` appended to `parent`.
function inline(text, parent, depth = 0) {
  let plain = "";
  const flush = () => { if (plain) { parent.append(plain); plain = ""; } };
  let i = 0;
  while (i < text.length) {
    const ch = text[i];
    if (!SPECIAL.has(ch)) { plain += ch; i += 1; continue; }
    const rest = text.slice(i);
    if (ch === "\\" && i + 1 < text.length && /[!-/:-@[-`{-~]/.test(text[i + 1])) {
      plain += text[i + 1];
      i += 2;
      continue;
    }
    if (ch === "`") {
      const ticks = /^`+/.exec(rest)[0];
      const end = text.indexOf(ticks, i + ticks.length);
      if (end > 0) {
        flush();
        parent.append(node("code", text.slice(i + ticks.length, end).replace(/^ (.+) $/, "$1")));
        i = end + ticks.length;
        continue;
      }
      plain += ticks;
      i += ticks.length;
      continue;
    }
    if (depth < MAX_DEPTH) {
      const span = emphasis(rest) || link(rest) || autolink(rest);
      if (span) {
        flush();
        const el = document.createElement(span.tag);
        if (span.href) {
          el.setAttribute("href", span.href);
          el.setAttribute("rel", "noopener noreferrer");
          el.setAttribute("target", "_blank");
        }
        if (span.literal !== undefined) el.append(span.literal); else inline(span.inner, el, depth + 1);
        parent.append(el);
        i += span.length;
        continue;
      }
    }
    plain += ch;
    i += 1;
  }
  flush();
}

// **strong**, __strong__, *em*, _em_, ~~del~~ at the start of `text` (None: not there).
function emphasis(text) {
  for (const [marker, tag] of [["**", "strong"], ["__", "strong"], ["~~", "del"], ["*", "em"], ["_", "em"]]) {
    if (!text.startsWith(marker) || /\s/.test(text[marker.length] || " ")) continue;
    let end = text.indexOf(marker, marker.length + 1);
    while (end > 0 && (/\s/.test(text[end - 1]) || text[end - 1] === "\\")) end = text.indexOf(marker, end + 1);
    if (end < 0) continue;
    // An underscore inside a word (snake_case) is no emphasis.
    if (marker[0] === "_" && /\w/.test(text[end + marker.length] || "")) continue;
    return { tag, inner: text.slice(marker.length, end), length: end + marker.length };
  }
  return null;
}

// [text](url "title"): a link when the url is http(s) or mailto; otherwise left as text.
function link(text) {
  const match = /^\[([^\]\n]{0,1000})\]\(\s*<?([^)\s>]{1,2000})>?(?:\s+"[^"\n]*")?\s*\)/.exec(text);
  if (!match || !SAFE_URL.test(match[2])) return null;
  return { tag: "a", href: match[2], inner: match[1], length: match[0].length };
}

function autolink(text) {
  const match = /^<((?:https?:\/\/|mailto:)[^\s<>]{1,2000})>/i.exec(text);
  if (!match) return null;
  return { tag: "a", href: match[1], literal: match[1], length: match[0].length };
}
