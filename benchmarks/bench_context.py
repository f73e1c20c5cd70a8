"""Per-step cost of agent_flow's budgeting against recount-everything trimming.

One "step" is what an agent does between model calls: add the new entries (an assistant
turn with a tool call, and its result) and build the next prompt within a 100k-token budget.

- agent_flow: `History.add` (counts only the new entry) + `ContextManager.build_prompt`.
- baseline: what ``trim_messages``-style trimming does each step: count every message of the
  history with tiktoken, then keep the newest that fit.

Both use the same tiktoken encoding (cl100k_base, offline) in the same process. With
``--xml`` the manager budgets the prompt as XML tool mode sends it (each step renders the
new units and counts the rendered prompt exactly).

A second table gives the step with an environment of N tokens that each step writes one
small tool result to (as the default tool-result handler does): agent_flow, which counts the
environment from its blocks (`splits_at_headings`), against the same counter told to count
the environment whole after each change.

Usage: python benchmarks/bench_context.py [--sizes 1000,10000,100000] [--steps 50] [--xml]
    [--environment-tokens 1000,5000,20000]
"""

from __future__ import annotations

import argparse
import time

from agent_flow.context import ContextManager
from agent_flow.environment import Environment, KnowledgeBase
from agent_flow.history import AgentMessage, History, ToolCallEntry, ToolResultEntry, UserMessage
from agent_flow.llm.xml_tools import XML_FORMAT
from agent_flow.messages import ChatMessage, ToolCall
from agent_flow.tokens import TiktokenCounter

BUDGET = 100_000
RESULT = "def parse(line):\n    return line.split(',')  # field separator\n" * 3


def entries_for_step(i: int) -> list[AgentMessage | ToolCallEntry | ToolResultEntry]:
    call_id = f"call_{i}"
    return [
        AgentMessage(content=f"Step {i}: reading the next file to trace the parser bug."),
        ToolCallEntry(
            call=ToolCall(id=call_id, name="read_file", arguments=f'{{"path": "src/mod_{i}.py"}}')
        ),
        ToolResultEntry(call_id=call_id, tool_name="read_file", content=RESULT),
    ]


def build_history(size: int, counter: TiktokenCounter) -> History:
    history = History(counter=counter)
    history.add(UserMessage(content="Find and fix the CSV parser bug in this project."))
    step = 0
    while len(history.entries) < size:
        history.extend(entries_for_step(step))
        step += 1
    return history


def baseline_trim(messages: list[ChatMessage], counter: TiktokenCounter, budget: int) -> int:
    """Recount every message, then keep the newest that fit (as trim_messages does)."""
    counts = [counter.count_message(m) for m in messages]
    total, kept = 0, 0
    for count in reversed(counts):
        if total + count > budget:
            break
        total += count
        kept += 1
    return kept


def bench(size: int, steps: int, counter: TiktokenCounter, xml: bool) -> tuple[float, float]:
    env = Environment()
    env.set("/task/objective", "Fix the CSV parser bug")
    history = build_history(size, counter)
    manager = ContextManager(
        env,
        history,
        BUDGET,
        counter=counter,
        reserve_output_tokens=4096,
        prompt_format=XML_FORMAT if xml else None,
    )
    manager.build_prompt()  # warm caches, as a running agent has them

    start = time.perf_counter()
    for i in range(steps):
        history.extend(entries_for_step(size + i))
        prompt = manager.build_prompt()
        assert prompt.total_tokens <= BUDGET - 4096
    ours = (time.perf_counter() - start) / steps

    messages = history.to_messages()
    base_steps = max(1, min(steps, 200_000 // size))
    start = time.perf_counter()
    for i in range(base_steps):
        step_entries = entries_for_step(10 * size + i)
        messages.append(
            ChatMessage(role="assistant", content=step_entries[0].content)  # type: ignore[union-attr]
        )
        baseline_trim(messages, counter, BUDGET - 4096)
    baseline = (time.perf_counter() - start) / base_steps
    return ours, baseline


class WholeCounter(TiktokenCounter):
    """The same tiktoken counter, which does not claim to split at headings."""

    def __init__(self) -> None:
        super().__init__()
        self.splits_at_headings = False


def bench_environment(env_tokens: int, steps: int, counter: TiktokenCounter) -> float:
    """Seconds per step: add a step's entries, write its result to the environment, build."""
    facts, size = [], 0
    while size < env_tokens:
        n = len(facts)
        facts.append(f"fact {n}: the CSV parser splits fields on commas in mod_{n}")
        size += counter.count(facts[-1]) + 1
    env = Environment(knowledge=KnowledgeBase(discovered_facts=facts))
    env.set("/task/objective", "Fix the CSV parser bug")
    history = build_history(100, counter)
    manager = ContextManager(env, history, BUDGET, counter=counter, reserve_output_tokens=4096)
    for i in range(2):  # warm caches, as a running agent has them
        env.set("/extensions/tool_results/read_file", {"content": f"warm {i}"})
        manager.build_prompt()
    start = time.perf_counter()
    for i in range(steps):
        history.extend(entries_for_step(1000 + i))
        env.set("/extensions/tool_results/read_file", {"content": RESULT, "step": i})
        prompt = manager.build_prompt()
        assert prompt.total_tokens <= BUDGET - 4096
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--xml", action="store_true", help="budget as XML tool mode sends")
    parser.add_argument("--environment-tokens", default="1000,5000,20000")
    args = parser.parse_args()
    counter = TiktokenCounter()
    mode = "xml tool mode" if args.xml else "native tool calling"
    print(
        f"budget {BUDGET} tokens, encoding {counter.encoding_name}, {mode}, {args.steps} steps each"
    )
    print(f"{'entries':>8} | {'agent_flow ms/step':>18} | {'recount-all ms/step':>19} | speed-up")
    for size in (int(s) for s in args.sizes.split(",")):
        ours, baseline = bench(size, args.steps, counter, args.xml)
        print(
            f"{size:>8} | {ours * 1e3:>18.3f} | {baseline * 1e3:>19.1f} | {baseline / ours:>7.0f}x"
        )
    print(f"\na step that writes one result to an environment of N tokens ({mode} history of 100)")
    header = f"{'env tokens':>10} | {'agent_flow ms/step':>18} | {'counted whole ms/step':>21}"
    print(f"{header} | speed-up")
    whole = WholeCounter()
    for env_tokens in (int(s) for s in args.environment_tokens.split(",")):
        ours = bench_environment(env_tokens, args.steps, counter)
        baseline = bench_environment(env_tokens, args.steps, whole)
        print(
            f"{env_tokens:>10} | {ours * 1e3:>18.3f} | {baseline * 1e3:>21.3f} | "
            f"{baseline / ours:>7.1f}x"
        )


if __name__ == "__main__":
    main()
