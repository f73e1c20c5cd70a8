"""Per-turn cost of agent_flow's loop against a minimal hand-written loop, same server.

A local OpenAI-compatible server (tests/openai_server.py) answers instantly with a script of
K tool steps per run (the model calls ``add`` K times, then answers). Three loops drive it:

- handwritten: ``AsyncOpenAI.chat.completions.create`` in a plain ``while`` loop, executing
  the tool and appending messages as dicts: the least a user writing it by hand does;
- floor: the same loop on the SDK's own transport with the body passed pre-built as bytes
  and the answer read as raw dicts (what `OpenAIClient` does): what no loop on the SDK can
  go under;
- agent_flow: `AgentExecutor` with `OpenAIClient`, events on with one subscriber reading
  them, token budgeting on (tiktoken), the loop-control tools offered: the defaults.

The time per model turn is the CPU time of the process (``time.process_time``: the machine
may be loaded by others, CPU time is what the loop costs); wall time is printed beside it.
The server runs in the same process, so its (equal) cost is in every column; with ``--server
own`` it runs in a process of its own and only the loops' CPU is counted (the issue's "CPU time
of the client process"; the ratios are then a little lower, as the server's share no longer
pads both sides). Each cell of the table (streaming x K x sequential/concurrent) runs in its
own child process, where the three loops take turns: rounds of one block of runs per loop, in
a rotating order, and the median over the rounds. On these machines the same child run costs
up to 40% more or less from one process to the next; loops measured side by side in one
process, round by round, see the same machine, so their ratio is steadier than best-of-N
separate processes. Steadier, not steady: the ratio itself still differs from one process to
the next by up to 0.05 (0.43x-0.48x in six processes of the same cell); ``--processes N`` runs
each cell in N processes in turn and prints the median across them and the range of
agent_flow's ratio. Memory is `bench_memory.py`'s.

Usage: python benchmarks/bench_loop.py [--quick] [--runs 200] [--concurrent 100] [--k 10,100]
    [--rounds 10] [--server same|own] [--processes 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _bench_rounds import interleaved

# The repo root must be importable before the test server is.
from tests.openai_server import (
    OpenAIServer,
    Reply,
    completion_body,
    json_reply,
    sse_reply,
    text_chunks,
    tool_call_chunks,
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]
SYSTEM = "You are a calculator agent. Use the add tool."


def make_handler(k: int, stream: bool) -> Any:
    """Answer with call n+1 while fewer than k tool results were sent, then with text."""
    calls: list[Reply] = []
    for n in range(k):
        arguments = json.dumps({"a": n, "b": 1})
        if stream:
            calls.append(sse_reply(tool_call_chunks([(f"call_{n}", "add", arguments)])))
        else:
            body = completion_body(
                None, tool_calls=[(f"call_{n}", "add", arguments)], finish_reason="tool_calls"
            )
            calls.append(json_reply(body))
    final = sse_reply(text_chunks("Done.")) if stream else json_reply(completion_body("Done."))

    def handler(request: Any) -> Reply:
        messages = json.loads(request.raw_body)["messages"]
        done = sum(1 for m in messages if m["role"] == "tool")
        return calls[done] if done < k else final

    return handler


async def handwritten_run(client: Any, stream: bool) -> int:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Add the numbers."},
    ]
    turns = 0
    while True:
        turns += 1
        if stream:
            text, calls = "", {}
            response = await client.chat.completions.create(
                model="m", messages=messages, tools=TOOLS, stream=True
            )
            async for chunk in response:
                if not chunk.choices:
                    continue
                delta = chunk.choices[0].delta
                text += delta.content or ""
                for fragment in delta.tool_calls or []:
                    entry = calls.setdefault(fragment.index, {"id": "", "name": "", "args": ""})
                    entry["id"] = fragment.id or entry["id"]
                    if fragment.function:
                        entry["name"] = fragment.function.name or entry["name"]
                        entry["args"] += fragment.function.arguments or ""
            tool_calls = [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": c["args"]},
                }
                for c in calls.values()
            ]
        else:
            response = await client.chat.completions.create(
                model="m", messages=messages, tools=TOOLS
            )
            message = response.choices[0].message
            text = message.content or ""
            tool_calls = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.function.name, "arguments": c.function.arguments},
                }
                for c in message.tool_calls or []
            ]
        if not tool_calls:
            return turns
        messages.append({"role": "assistant", "content": text or None, "tool_calls": tool_calls})
        for call in tool_calls:
            args = json.loads(call["function"]["arguments"])
            messages.append(
                {"role": "tool", "tool_call_id": call["id"], "content": str(add(**args))}
            )


async def floor_run(client: Any, stream: bool) -> int:
    """The handwritten loop on the SDK's transport: pre-built bytes in, raw dicts out."""
    from openai import AsyncStream

    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Add the numbers."},
    ]
    options: Any = {"security": {"bearer_auth": True}}
    turns = 0
    while True:
        turns += 1
        body = {"model": "m", "messages": messages, "tools": TOOLS}
        if stream:
            body["stream"] = True
            content = json.dumps(body, separators=(",", ":")).encode()
            response = await client.post(
                "/chat/completions",
                cast_to=object,
                content=content,
                options=options,
                stream=True,
                stream_cls=AsyncStream[object],
            )
            text, calls = "", {}
            async for chunk in response:
                if not chunk["choices"]:
                    continue
                delta = chunk["choices"][0]["delta"]
                text += delta.get("content") or ""
                for fragment in delta.get("tool_calls") or []:
                    entry = calls.setdefault(fragment["index"], {"id": "", "name": "", "args": ""})
                    entry["id"] = fragment.get("id") or entry["id"]
                    function = fragment.get("function") or {}
                    entry["name"] = function.get("name") or entry["name"]
                    entry["args"] += function.get("arguments") or ""
            tool_calls = [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": c["args"]},
                }
                for c in calls.values()
            ]
        else:
            content = json.dumps(body, separators=(",", ":")).encode()
            data = await client.post(
                "/chat/completions", cast_to=object, content=content, options=options
            )
            message = data["choices"][0]["message"]
            text = message.get("content") or ""
            tool_calls = message.get("tool_calls") or []
        if not tool_calls:
            return turns
        messages.append({"role": "assistant", "content": text or None, "tool_calls": tool_calls})
        for call in tool_calls:
            args = json.loads(call["function"]["arguments"])
            messages.append(
                {"role": "tool", "tool_call_id": call["id"], "content": str(add(**args))}
            )


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


_tools: list[Any] = []


def add_tool() -> Any:
    """`add` as an agent_flow tool, made once, as an application defines its tools once."""
    if not _tools:
        from agent_flow.tools import tool

        _tools.append(tool(add))
    return _tools[0]


def make_agent(client: Any, stream: bool) -> Any:
    from agent_flow import AgentConfig, AgentExecutor, ContextConfig

    config = AgentConfig(
        system_prompt=SYSTEM + "\n{environment}",
        context=ContextConfig(max_tokens=64_000),
        max_iterations=1000,
        stuck_threshold=1000,
    )
    agent = AgentExecutor(client, config=config, stream=stream)
    agent.tools.register(add_tool())
    return agent


async def agent_flow_run(client: Any, stream: bool) -> int:
    agent = make_agent(client, stream)
    subscription = agent.subscribe()

    async def drain() -> int:
        # A subscriber handles each event and lets it go (keeping every event of every run in
        # flight would be the subscriber's memory, not the loop's).
        count = 0
        async for _ in subscription:
            count += 1
        return count

    reader = asyncio.create_task(drain())
    outcome = await agent.run("Add the numbers.")
    await reader
    assert outcome.final_text == "Done.", outcome
    return outcome.iterations


#: Where the scripted server runs: ``"same"`` (in the measured process, its CPU in every
#: column, as the figures before the seventeenth session were measured) or ``"own"`` (a
#: process of its own: only the clients' CPU is counted). Set by ``--server``.
SERVER_PLACE = "same"


async def model_server(stream: bool, k: int) -> None:
    """``--model-server``: serve the script; print the base URL; stop when stdin closes."""
    async with OpenAIServer(handler=make_handler(k, stream)) as server:
        server.record = False
        print(server.base_url, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


@asynccontextmanager
async def _base_url(stream: bool, k: int) -> AsyncIterator[str]:
    """The scripted server's base URL, in this process or in its own (`SERVER_PLACE`)."""
    if SERVER_PLACE == "same":
        async with OpenAIServer(handler=make_handler(k, stream)) as server:
            server.record = False
            yield server.base_url
        return
    command = [sys.executable, __file__, "--model-server", "--k-one", str(k)]
    command += ["--stream"] if stream else []
    pipe = asyncio.subprocess.PIPE
    child = await asyncio.create_subprocess_exec(*command, stdin=pipe, stdout=pipe)
    assert child.stdin is not None
    assert child.stdout is not None
    try:
        yield (await child.stdout.readline()).decode().strip()
    finally:
        child.stdin.close()
        await asyncio.wait_for(child.wait(), 10)


@asynccontextmanager
async def serving(stream: bool, k: int) -> AsyncIterator[Callable[[str], Awaitable[int]]]:
    """A local server scripted for K-step runs, and ``one(loop)``: one run of `loop` on it."""
    from openai import AsyncOpenAI

    from agent_flow import OpenAIClient

    async with _base_url(stream, k) as base_url:
        # All loops reuse one client across runs, as an application would.
        client = AsyncOpenAI(base_url=base_url, api_key="k")
        ours = OpenAIClient("m", base_url=base_url, api_key="k")

        async def one(loop: str) -> int:
            if loop == "handwritten":
                return await handwritten_run(client, stream)
            if loop == "floor":
                return await floor_run(client, stream)
            return await agent_flow_run(ours, stream)

        yield one


async def block(
    one: Callable[[str], Awaitable[int]], loop: str, runs: int, concurrent: bool
) -> tuple[float, float, int]:
    """`runs` runs of `loop`, one after another or all at once: CPU and wall ms per turn."""
    start, cpu_start = time.perf_counter(), time.process_time()
    if concurrent:
        turns = sum(await asyncio.gather(*(one(loop) for _ in range(runs))))
    else:
        turns = 0
        for _ in range(runs):
            turns += await one(loop)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    return cpu * 1000 / turns, elapsed * 1000 / turns, turns


async def measure(loop: str, stream: bool, k: int, runs: int, concurrent: bool) -> dict[str, Any]:
    """One loop alone (``--child --loop L``: what `attribute.py` and py-spy profile)."""
    async with serving(stream, k) as one:
        await one(loop)  # warm-up: imports, connections, tokenizer
        cpu, wall, turns = await block(one, loop, runs, concurrent)
    return {"ms_per_turn": cpu, "wall_ms_per_turn": wall, "turns": turns}


LOOPS = ("handwritten", "floor", "agent_flow")


async def measure_rounds(
    stream: bool, k: int, runs: int, concurrent: bool, rounds: int
) -> dict[str, Any]:
    """All three loops in one process, interleaved: `rounds` blocks of `runs` runs each.

    Each round runs one block per loop, in an order that rotates from round to round, so
    that every loop meets the same machine (caches, other load) as the others. A block is
    `runs` runs one after another, or all at once when `concurrent`. Returns, per loop, the
    median and least CPU ms per turn over the rounds, the median wall ms per turn, and the
    median over the rounds of each loop's ratio to the handwritten loop in the same round.
    """
    per_round: dict[str, list[tuple[float, float]]] = {loop: [] for loop in LOOPS}
    async with serving(stream, k) as one:
        for loop in LOOPS:  # warm-up: imports, connections, tokenizer
            await one(loop)
        for loop in interleaved(LOOPS, rounds):
            cpu, wall, _ = await block(one, loop, runs, concurrent)
            per_round[loop].append((cpu, wall))
    base = [cpu for cpu, _ in per_round["handwritten"]]
    return {
        loop: {
            "ms_per_turn": statistics.median(cpu for cpu, _ in rounds_),
            "least_ms_per_turn": min(cpu for cpu, _ in rounds_),
            "wall_ms_per_turn": statistics.median(wall for _, wall in rounds_),
            "ratio": statistics.median(
                cpu / hw for (cpu, _), hw in zip(rounds_, base, strict=True)
            ),
        }
        for loop, rounds_ in per_round.items()
    }


async def measure_k_ratio(stream: bool, ks: list[int], rounds: int) -> dict[int, float]:
    """agent_flow's CPU ms per turn at each K, interleaved in one process (median of rounds).

    Each K has its own server; a round runs, for each K, a block of runs one after another
    of at least `_TURNS_PER_BLOCK` turns (K + 1 per run), so every K meets the same machine.
    """
    per_k: dict[int, list[float]] = {k: [] for k in ks}
    async with AsyncExitStack() as stack:
        ones = {k: await stack.enter_async_context(serving(stream, k)) for k in ks}
        for k in ks:
            await ones[k]("agent_flow")  # warm-up
        for _ in range(rounds):
            for k in ks:
                runs = -(-_TURNS_PER_BLOCK // (k + 1))
                cpu, _, _ = await block(ones[k], "agent_flow", runs, concurrent=False)
                per_k[k].append(cpu)
    return {k: statistics.median(values) for k, values in per_k.items()}


_TURNS_PER_BLOCK = 200


def child(args: argparse.Namespace) -> None:
    if args.k_ratio:
        ks = [int(v) for v in args.k.split(",")]
        print(json.dumps(asyncio.run(measure_k_ratio(args.stream, ks, args.rounds))))
        return
    if args.loop is not None:
        alone = measure(args.loop, args.stream, args.k_one, args.runs, args.concurrent_mode)
        print(json.dumps(asyncio.run(alone)))
        return
    result = asyncio.run(
        measure_rounds(args.stream, args.k_one, args.runs, args.concurrent_mode, args.rounds)
    )
    print(json.dumps(result))


def run_child(stream: bool, k: int, runs: int, concurrent: bool, rounds: int) -> dict[str, Any]:
    """One cell of the table, in a fresh process."""
    command = [sys.executable, __file__, "--child", "--k-one", str(k), "--server", SERVER_PLACE]
    command += ["--runs", str(runs), "--rounds", str(rounds)]
    if stream:
        command.append("--stream")
    if concurrent:
        command.append("--concurrent-mode")
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    result: dict[str, Any] = json.loads(output.strip().splitlines()[-1])
    return result


def across(children: list[dict[str, Any]]) -> dict[str, Any]:
    """One cell's figures over its child processes: each figure's median across them."""
    return {
        loop: {
            key: statistics.median(child[loop][key] for child in children)
            for key in ("ms_per_turn", "wall_ms_per_turn", "ratio")
        }
        for loop in LOOPS
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=200, help="sequential runs per loop")
    parser.add_argument("--concurrent", type=int, default=100, help="runs at once")
    parser.add_argument("--k", default="10,100", help="tool steps per run")
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds per cell")
    parser.add_argument("--quick", action="store_true", help="fewer runs and rounds, K=10")
    parser.add_argument(
        "--server",
        choices=("same", "own"),
        default="same",
        help="the scripted server in the measured process (its CPU in every column, the "
        "default) or in its own (only the loops' CPU counted)",
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=1,
        help="child processes per cell (the same code's ratio differs from one process to "
        "the next by up to 0.05: the median across them, and their range, are printed)",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model-server", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--loop", choices=LOOPS, help=argparse.SUPPRESS)
    parser.add_argument("--k-ratio", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--k-one", type=int, default=10, help=argparse.SUPPRESS)
    parser.add_argument("--stream", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--concurrent-mode", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    global SERVER_PLACE
    SERVER_PLACE = args.server
    if args.model_server:
        asyncio.run(model_server(args.stream, args.k_one))
        return
    if args.child:
        child(args)
        return
    if args.quick:
        args.runs, args.concurrent, args.rounds, args.k = 60, 100, 4, "10"

    print(f"CPU ms per model turn (lower is better): the median of {args.rounds} interleaved")
    print("rounds; ratio = the median of each round's loop / handwritten; wall ms per turn")
    if args.processes > 1:
        print(f"each figure the median over {args.processes} child processes per cell")
    print(
        f"{'K':>4} {'mode':>9} {'stream':>6} | {'handwritten':>11} | {'floor':>11} | "
        f"{'agent_flow':>11} | {'wall hw/fl/af':>17}"
        + (" | agent_flow's range" if args.processes > 1 else "")
    )
    for k in (int(v) for v in args.k.split(",")):
        # K=100 runs are ten times longer; scale the run counts to keep the total bounded.
        scale = max(1, k // 10)
        cells = (
            (False, max(args.runs // args.rounds // scale, 1), args.rounds),
            # A concurrent round is `concurrent` runs at once; half the rounds keep it short.
            (True, max(args.concurrent // scale, 2), max(args.rounds // 2, 2)),
        )
        for concurrent, runs, rounds in cells:
            for stream in (False, True):
                children = [
                    run_child(stream, k, runs, concurrent, rounds) for _ in range(args.processes)
                ]
                res = across(children)
                base = res["handwritten"]["ms_per_turn"]
                mode = f"{runs}x{'par' if concurrent else 'seq'}x{rounds}"
                row = [f"{base:>11.3f}"] + [
                    f"{res[loop]['ms_per_turn']:>5.3f} {res[loop]['ratio']:>4.2f}x"
                    for loop in LOOPS[1:]
                ]
                wall = "/".join(f"{res[loop]['wall_ms_per_turn']:.2f}" for loop in LOOPS)
                spread = ""
                if len(children) > 1:
                    ratios = sorted(child["agent_flow"]["ratio"] for child in children)
                    spread = f" | {ratios[0]:.2f}-{ratios[-1]:.2f}x"
                print(
                    f"{k:>4} {mode:>9} {stream!s:>6} | "
                    + " | ".join(row)
                    + f" | {wall:>17}{spread}",
                    flush=True,
                )
    ks = sorted({int(v) for v in args.k.split(",")})
    if len(ks) > 1:
        print(f"agent_flow per turn at K={ks}, one after another, interleaved in one process:")
        for stream in (False, True):
            command = [sys.executable, __file__, "--child", "--k-ratio", "--k", args.k]
            command += ["--rounds", str(args.rounds)] + (["--stream"] if stream else [])
            output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            by_k = {int(k): v for k, v in json.loads(output.strip().splitlines()[-1]).items()}
            cells = ", ".join(f"K={k} {by_k[k]:.3f} ms ({by_k[k] / by_k[ks[0]]:.2f}x)" for k in ks)
            print(f"  stream={stream!s:<5} {cells}", flush=True)


if __name__ == "__main__":
    main()
