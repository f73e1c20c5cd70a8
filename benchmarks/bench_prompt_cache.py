"""What a provider's prompt cache can serve of agent_flow's prompts, by environment placement.

OpenAI, DeepSeek, Gemini, vLLM and llama.cpp cache prompts by exact prefix: the part of a
request that repeats the start of an earlier one is read from the cache (billed at the
cache-read price, not computed again). This runs one agent task twice on the local scripted
server (tests/openai_server.py), once per ``environment_placement``, with the defaults
otherwise (default template, control tools, the default result handler): the model reads
``--steps`` pages of notes (``--page-tokens`` each), one per step, then answers. For every
request it renders the tools and messages as a chatml-like text, encodes it with tiktoken
(o200k_base), and counts the tokens it shares from the start with the previous request of the
run. Printed per placement, over the run:

- prompt tokens sent;
- the shared prefix (what any prefix cache could serve);
- OpenAI's rule on it (only prompts of 1,024 tokens and more, in steps of 128 tokens);
- the run's input cost at genai-prices' prices for ``--models``, with the cached part billed
  at each model's cache-read price, against no cache at all.

``--llama`` also replays both runs' prompts (rewritten as plain text, the way XML tool mode
sends them) to a real llama-cpp-python server with SmolLM2-135M (the ``real-llm`` extra; see
tests/real_llm.py), one answer token each, and prints the wall time the server took per
request: llama.cpp keeps the previous prompt's computed state and evaluates only what
follows the shared prefix.

Usage: python benchmarks/bench_prompt_cache.py [--steps 20] [--page-tokens 300]
    [--models gpt-4.1,gpt-5-mini] [--llama]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent_flow._prompt_environment import PLACEMENTS
from tests.openai_server import OpenAIServer, Reply, completion_body, json_reply

_TEXT = (
    "the ledger shows quarterly revenue rising while costs held steady across regions and "
    "the team noted three open risks in supply contracts with two vendors pending review"
)
_WORDS = tuple(_TEXT.split(" "))


def notes_page(n: int, tokens: int) -> str:
    """Page `n` of the notes: about `tokens` tokens of plain words, different per page."""
    words = [_WORDS[(n * 7 + i * 3) % len(_WORDS)] for i in range(int(tokens * 0.8))]
    return f"Page {n}: " + " ".join(words) + "."


def handler(steps: int) -> Any:
    """Ask for page n+1 while fewer than `steps` results were sent, then answer."""

    def answer(request: Any) -> Reply:
        done = sum(1 for m in json.loads(request.raw_body)["messages"] if m["role"] == "tool")
        if done >= steps:
            return json_reply(completion_body("The notes are summarized."))
        call = (f"call_{done}", "read_notes", json.dumps({"page": done}))
        return json_reply(completion_body(None, tool_calls=[call], finish_reason="tool_calls"))

    return answer


async def run_task(placement: str, steps: int, page_tokens: int) -> list[dict[str, Any]]:
    """One run of the task with `placement`: the bodies of the requests it sent."""
    from agent_flow import AgentConfig, AgentExecutor, ContextConfig, OpenAIClient
    from agent_flow.tools import tool

    @tool(name="read_notes")
    def read_notes_tool(page: int) -> str:
        """Read one page of the notes.

        Args:
            page: The page number, from 0.
        """
        return notes_page(page, page_tokens)

    config = AgentConfig(
        context=ContextConfig(environment_placement=placement),  # type: ignore[arg-type]
        max_iterations=steps + 5,
    )
    async with OpenAIServer(handler=handler(steps)) as server:
        async with OpenAIClient("m", base_url=server.base_url, api_key="k") as llm:
            agent = AgentExecutor(llm, config=config)
            agent.tools.register(read_notes_tool)
            outcome = await agent.run("Summarize the notes, page by page.")
        assert outcome.final_text == "The notes are summarized.", outcome
        return [json.loads(r.raw_body) for r in server.requests]


def chatml(body: dict[str, Any]) -> str:
    """The request as one text, the way a chatml template lays it out (tools first)."""
    parts = [json.dumps(body.get("tools", []), separators=(",", ":"))]
    for m in body["messages"]:
        calls = json.dumps(m.get("tool_calls", []), separators=(",", ":"))
        parts.append(f"<|im_start|>{m['role']}\n{m.get('content') or ''}{calls}<|im_end|>\n")
    return "".join(parts)


def shared_chars(a: str, b: str) -> int:
    """How many characters `a` and `b` share from the start."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def cache_figures(bodies: list[dict[str, Any]]) -> dict[str, int]:
    """Tokens sent, tokens a prefix cache could serve, and what OpenAI's rule would.

    Counted with agent_flow's offline o200k_base counter; the shared prefix is the count of
    the shared text, less the token that may straddle its end.
    """
    from agent_flow.tokens import TiktokenCounter

    counter = TiktokenCounter("gpt-4o")
    sent = prefix = openai_rule = 0
    previous = ""
    for body in bodies:
        text = chatml(body)
        tokens = counter.count(text)
        chars = shared_chars(previous, text)
        common = 0 if chars == 0 else min(tokens, max(0, counter.count(text[:chars]) - 1))
        sent += tokens
        prefix += common
        if tokens >= 1024 and common >= 1024:
            openai_rule += common // 128 * 128
        previous = text
    return {"requests": len(bodies), "sent": sent, "prefix": prefix, "openai": openai_rule}


def input_cost(model: str, sent: int, cached: int) -> float | None:
    """The input cost of `sent` prompt tokens, `cached` of them read from the cache."""
    from agent_flow.llm.base import Usage
    from agent_flow.pricing import price_usage

    usage = Usage(prompt_tokens=sent, completion_tokens=0, cached_tokens=cached)
    return price_usage(model, usage, base_url="https://api.openai.com/v1")


def llama_replay(
    runs: dict[str, list[dict[str, Any]]],
) -> dict[str, tuple[list[float], list[tuple[int, int]]]]:
    """The real llama-cpp-python server on each run's prompts, in order.

    Returns, per placement, the seconds each request took, and for each the server's own
    counts from its log: the tokens it matched in its cache and the tokens it evaluated.
    """
    import httpx2

    from agent_flow.llm.xml_tools import XML_FORMAT
    from agent_flow.messages import ChatMessage, ToolCall
    from tests.real_llm import MODEL, start_llama_server

    def text_messages(body: dict[str, Any]) -> list[dict[str, str]]:
        messages = [
            ChatMessage(
                role=m["role"],
                content=m.get("content") or "",
                tool_call_id=m.get("tool_call_id"),
                tool_calls=tuple(
                    ToolCall(
                        id=c["id"], name=c["function"]["name"], arguments=c["function"]["arguments"]
                    )
                    for c in m.get("tool_calls", [])
                ),
            )
            for m in body["messages"]
        ]
        rendered, _ = XML_FORMAT.render(messages, ())
        return [{"role": m.role, "content": m.content} for m in rendered]

    seconds: dict[str, tuple[list[float], list[tuple[int, int]]]] = {}
    with (
        tempfile.TemporaryDirectory() as work,
        start_llama_server(Path(work)) as server,
        httpx2.Client(timeout=600) as http,
    ):
        for placement, bodies in runs.items():
            times: list[float] = []
            counts: list[tuple[int, int]] = []
            seconds[placement] = (times, counts)
            # A first request unrelated to both runs: neither starts with a warm cache.
            for body in [{"messages": [{"role": "user", "content": "Hello."}]}, *bodies]:
                messages = body["messages"] if "tools" not in body else text_messages(body)
                logged = len(server.log.read_text(errors="replace"))
                start = time.perf_counter()
                answer = http.post(
                    f"{server.base_url}/chat/completions",
                    json={"model": MODEL, "messages": messages, "max_tokens": 1},
                )
                answer.raise_for_status()
                times.append(time.perf_counter() - start)
                found = re.search(
                    r"(\d+) prefix-match hit, remaining (\d+) prompt tokens",
                    server.log.read_text(errors="replace")[logged:],
                )
                counts.append((int(found[1]), int(found[2])) if found else (0, -1))
            del times[0], counts[0]
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--page-tokens", type=int, default=300)
    parser.add_argument("--models", default="gpt-4.1,gpt-5-mini,deepseek-chat")
    parser.add_argument("--llama", action="store_true", help="replay on a real llama.cpp server")
    args = parser.parse_args()
    runs = {p: asyncio.run(run_task(p, args.steps, args.page_tokens)) for p in PLACEMENTS}
    models = [m for m in args.models.split(",") if m]
    print(
        f"one task, {args.steps} tool steps of ~{args.page_tokens}-token pages, default agent "
        "config; tokens of the chatml-like rendering (o200k_base), summed over the run"
    )
    print(
        f"{'placement':>9} | requests |    sent | shared prefix | OpenAI-cached | "
        + " | ".join(f"{m} cached / uncached" for m in models)
    )
    for placement, bodies in runs.items():
        f = cache_figures(bodies)
        costs = []
        for model in models:
            cached, full = (
                input_cost(model, f["sent"], f["openai"]),
                input_cost(model, f["sent"], 0),
            )
            costs.append(
                "unknown" if cached is None or full is None else f"${cached:.4f} / ${full:.4f}"
            )
        print(
            f"{placement:>9} | {f['requests']:>8} | {f['sent']:>7} | "
            f"{f['prefix']:>7} ({f['prefix'] / f['sent']:4.0%}) | "
            f"{f['openai']:>7} ({f['openai'] / f['sent']:4.0%}) | " + " | ".join(costs)
        )
    if args.llama:
        seconds = llama_replay(runs)
        print("llama-cpp-python, SmolLM2-135M, 2 threads: seconds per request (one answer token)")
        for placement, (times, counts) in seconds.items():
            median = statistics.median(times)
            matched = sum(c[0] for c in counts)
            evaluated = sum(c[1] for c in counts)
            print(
                f"{placement:>9} | total {sum(times):7.2f} s | median {median:.3f} s | "
                f"last {times[-1]:.3f} s | tokens matched in its cache {matched}, "
                f"evaluated {evaluated}"
            )


if __name__ == "__main__":
    main()
