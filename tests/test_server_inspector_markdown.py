"""The inspector's Markdown renderer (``static/markdown.js``), run in Chromium, under hypothesis.

Whatever the text, the renderer makes only its few tags, a link only to an http(s) or mailto
address, and never loses or invents text; plain prose comes out as it went in; a document
built from known blocks comes out as those blocks, in order. The module is loaded as the page
loads it, from the package's files (Playwright serves them: no server, no network).
"""

from __future__ import annotations

import importlib.resources
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.inspector_browser import ARGS, CHROMIUM, browser_or_skip

_STATIC = importlib.resources.files("agent_flow.server").joinpath("static")
_TAGS = {
    "p", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "code", "em", "strong", "del", "a", "ul",
    "ol", "li", "blockquote", "hr", "table", "thead", "tbody", "tr", "th", "td", "br",
}  # fmt: skip
_RENDER = """text => {
  const root = document.createElement("div");
  root.append(window.markdown.renderMarkdown(text));
  const nodes = [...root.querySelectorAll("*")];
  return {
    tags: nodes.map(n => n.tagName.toLowerCase()),
    attributes: nodes.flatMap(
      n => [...n.attributes].map(a => [n.tagName.toLowerCase(), a.name, a.value])),
    text: root.textContent,
    blocks: [...root.children].map(n => [n.tagName.toLowerCase(), n.textContent]),
  };
}"""

Render = Callable[[str], dict[str, Any]]


def _route(route: Any) -> None:
    name = route.request.url.rsplit("/", 1)[-1]
    if route.request.url.endswith(".js"):
        body = _STATIC.joinpath(name).read_text("utf-8")
        route.fulfill(status=200, content_type="text/javascript", body=body)
    else:
        route.fulfill(status=200, content_type="text/html", body="<!doctype html><title>t</title>")


@pytest.fixture(scope="module")
def render() -> Iterator[Render]:
    browser_or_skip()
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page()
            page.route("http://inspector.test/**", _route)
            page.goto("http://inspector.test/")
            page.evaluate("async () => { window.markdown = await import('/static/markdown.js'); }")
            yield lambda text: page.evaluate(_RENDER, text)
        finally:
            browser.close()


def _squeezed(text: str) -> str:
    return re.sub(r"\s+", "", text)


def _is_subsequence(part: str, whole: str) -> bool:
    letters = iter(whole)
    return all(letter in letters for letter in part)


_MARKUP = st.sampled_from(
    [
        "*", "**", "_", "__", "~~", "`", "```", "#", "# ", "> ", "- ", "1. ", "|", "---", "\n",
        "\n\n", "  \n", "\\", "[", "](", ")", "<", ">", "http://x.org", "javascript:alert(1)",
        "mailto:a@b.c", "<script>alert(1)</script>", '<img src=x onerror="alert(1)">', "&amp;",
        "  ", "    ", "\t", "3) ", "+ ", ":-", "<http://y.org>", "<javascript:x>", "[a](b)",
    ]
)  # fmt: skip
_URL = st.sampled_from(
    [
        "https://x.org/a?b=c", "http://y", "mailto:a@b.c", "javascript:alert(1)",
        "JaVaScRiPt:alert(1)", "data:text/html,<b>", "vbscript:x", "//evil.org", "/local", "#top",
    ]
)  # fmt: skip
_LINK = st.builds(lambda text, url: f"[{text}]({url})", st.text(max_size=6), _URL)
_ANY = st.lists(st.one_of(_MARKUP, _LINK, st.text(max_size=8)), max_size=40).map("".join)


@settings(max_examples=300)
@given(text=_ANY)
def test_any_text_renders_to_safe_nodes_without_losing_or_inventing_text(
    render: Render, text: str
) -> None:
    out = render(text)
    assert set(out["tags"]) <= _TAGS
    for tag, name, value in out["attributes"]:
        if tag == "a" and name == "href":
            assert re.match(r"(https?://|mailto:)", value, re.IGNORECASE), value
        elif tag == "a":
            assert (name, value) in {("rel", "noopener noreferrer"), ("target", "_blank")}
        elif tag == "ol":
            assert name == "start" and value.isdigit()
        else:
            assert (tag, name) == ("code", "data-language"), (tag, name, value)
    # Markup characters go; text never comes from nowhere, nor twice.
    assert _is_subsequence(_squeezed(out["text"]), _squeezed(text.replace("\r", ""))), out


_PLAIN = st.text(alphabet=st.sampled_from("abcdefghijklmnopqrstuvwxyz ABCXYZ,;?'\"!"), max_size=80)


@settings(max_examples=100)
# Two trailing spaces are Markdown (a hard break, <br>), not plain prose.
@given(
    lines=st.lists(
        _PLAIN.filter(lambda line: bool(line.strip()) and not line.endswith("  ")),
        min_size=1,
        max_size=4,
    )
)
def test_plain_prose_comes_out_as_it_went_in(render: Render, lines: list[str]) -> None:
    out = render("\n".join(lines))
    assert out["tags"] == ["p"]
    assert out["text"].split() == " ".join(lines).split()


_WORD = st.text(alphabet="abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=8)
_WORDS = st.lists(_WORD, min_size=1, max_size=6).map(" ".join)
_BLOCK = st.one_of(
    st.tuples(st.integers(1, 6), _WORDS).map(lambda b: (f"h{b[0]}", "#" * b[0] + " " + b[1], b[1])),
    _WORDS.map(lambda w: ("p", w, w)),
    st.lists(_WORDS, min_size=1, max_size=4).map(
        lambda items: ("ul", "\n".join(f"- {item}" for item in items), "".join(items))
    ),
    st.lists(_WORDS, min_size=1, max_size=4).map(
        lambda items: (
            "ol",
            "\n".join(f"{n}. {item}" for n, item in enumerate(items, 1)),
            "".join(items),
        )
    ),
    st.lists(_WORDS, min_size=1, max_size=3).map(
        lambda lines: ("pre", "```\n" + "\n".join(lines) + "\n```", "\n".join(lines))
    ),
    _WORDS.map(lambda w: ("blockquote", f"> {w}", w)),
)


@settings(max_examples=150)
@given(blocks=st.lists(_BLOCK, min_size=1, max_size=6))
def test_a_document_of_known_blocks_comes_out_as_those_blocks(
    render: Render, blocks: list[tuple[str, str, str]]
) -> None:
    out = render("\n\n".join(source for _, source, _ in blocks))
    assert [tag for tag, _ in out["blocks"]] == [tag for tag, _, _ in blocks]
    for (_, text), (_, _, expected) in zip(out["blocks"], blocks, strict=True):
        assert text.strip() == expected


def test_emphasis_links_and_code_inline(render: Render) -> None:
    out = render("a **b** *c* `d*e` [f](https://g.org) ~~h~~ snake_case_name <script>")
    assert out["tags"] == ["p", "strong", "em", "code", "a", "del"]
    assert out["text"] == "a b c d*e f h snake_case_name <script>"
    assert ["a", "href", "https://g.org"] in out["attributes"]
