"""A custom tool with an environment handler: the design notes' weather tool.

``WeatherTool`` is a class-based tool (name, description, JSON schema, ``run``) as in the
design notes; a one-function tool is ``@tool`` on a typed function instead. A result handler
registered for ``get_weather`` turns each result into environment state: the reading at
``/extensions/weather/<location>`` and a fact in ``/knowledge/discovered_facts``. The
agent's later prompts carry that state even after the raw results are pruned away.

The readings come from a small table so that the example runs offline; a real tool would
call a weather API in ``run``.

    python examples/custom_tool.py

Uses a scripted model unless OPENAI_BASE_URL or OPENAI_API_KEY is set (then OPENAI_MODEL,
default gpt-4o-mini, gets the same tool and question). A real model may ask about other
cities, or none: the handler records what came back and the report says what is missing.
Run with ``agent-flow``; ``build_agent`` takes an ``llm``, so the model flags reach it (without
them it picks its model as above)::

    agent-flow chat --agent examples/custom_tool.py:build_agent
    agent-flow chat --agent examples/custom_tool.py:build_agent \
        --model qwen2.5 --base-url http://localhost:11434/v1
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from agent_flow import AgentConfig, AgentExecutor, ContextConfig, Environment, ToolCall
from agent_flow.errors import ToolError
from agent_flow.events import EnvironmentUpdated
from agent_flow.llm import LLMClient, LLMRequest, OpenAIClient
from agent_flow.testing import Reply, ScriptedLLM, ScriptStep, call, reply
from agent_flow.tools import (
    BaseTool,
    HandlerRegistry,
    ToolContext,
    ToolExecutor,
    ToolPolicy,
    ToolResult,
)

READINGS = {
    "paris": {"temperature": 72, "conditions": "sunny"},
    "tokyo": {"temperature": 64, "conditions": "light rain"},
    "reykjavik": {"temperature": 41, "conditions": "windy"},
}


class WeatherTool(BaseTool):
    name = "get_weather"
    description = "Get the current weather for a location"
    parameters = {  # noqa: RUF012 - a class attribute read by the executor
        "type": "object",
        "properties": {
            "location": {"type": "string", "description": "The location to get weather for"}
        },
        "required": ["location"],
    }
    policy = ToolPolicy(read_only=True)

    async def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        location = str(arguments["location"])
        reading = READINGS.get(location.lower())
        if reading is None:
            raise ToolError(f"no weather for {location!r}; known: {', '.join(READINGS)}")
        data = {**reading, "location": location}
        return ToolResult(
            content=f"{location}: {reading['temperature']}°F, {reading['conditions']}", data=data
        )


def weather_handler(env: Environment, call: ToolCall, result: ToolResult) -> None:
    """Keep each reading in the environment, keyed by location."""
    data = result.data
    if result.is_error or not isinstance(data, dict):
        return  # an unknown city: the model reads the error, there is nothing to keep
    location = str(data.get("location", "?"))
    env.set(f"/extensions/weather/{location.lower()}", data)
    env.set(
        "/knowledge/discovered_facts/-",
        f"weather in {location}: {data['conditions']}, {data['temperature']}°F",
    )


def answer(request: LLMRequest) -> Reply:
    """The scripted model's answer, from the readings it was sent."""
    readings = [m.content for m in request.messages if m.role == "tool"]
    rainy = [r.split(":")[0] for r in readings if "rain" in r]
    advice = f" Pack an umbrella for {', '.join(rainy)}." if rainy else ""
    return reply("Right now: " + "; ".join(readings) + "." + advice)


SCRIPT: list[ScriptStep] = [
    reply(
        "Checking both cities.",
        tool_calls=[call("get_weather", location="Paris"), call("get_weather", location="Tokyo")],
    ),
    answer,
]


def choose_model(script: list[ScriptStep]) -> LLMClient:
    """A real model when OPENAI_BASE_URL or OPENAI_API_KEY is set, else the scripted one."""
    if os.environ.get("OPENAI_BASE_URL") or os.environ.get("OPENAI_API_KEY"):
        return OpenAIClient(os.environ.get("OPENAI_MODEL", "gpt-4o-mini"))
    return ScriptedLLM(script)


def build_agent(llm: LLMClient | None = None) -> AgentExecutor:
    """The weather agent: its tool, its handler, its budget.

    ``--agent`` passes the model of ``--model``, ``--base-url`` (and ``--provider``,
    ``--api-key-env``, ``--timeout``) as `llm` when one of them is given, else calls it bare.
    """
    handlers = HandlerRegistry.with_defaults()
    handlers.register("get_weather", weather_handler)
    tools = ToolExecutor([WeatherTool()], handlers=handlers)
    return AgentExecutor(
        llm if llm is not None else choose_model(SCRIPT),
        config=AgentConfig(name="weather", context=ContextConfig(max_tokens=8_000)),
        tools=tools,
    )


async def main() -> None:
    agent = build_agent()
    print(f"model: {type(agent.llm).__name__}")
    changes = agent.subscribe(kinds=["environment_updated"])

    async def watch() -> None:
        async for event in changes:
            if isinstance(event, EnvironmentUpdated):
                for change in event.changes:
                    print(f"  environment v{change.version}: {change.op} {change.pointer}")

    async with asyncio.TaskGroup() as group:
        group.create_task(watch())
        outcome = await agent.run("What's the weather in Paris and Tokyo?")

    print(f"answer: {outcome.final_text or '(none: the run ' + outcome.stop_reason.value + ')'}")
    # Read with a default: a real model may not have asked for any weather at all.
    weather = (
        agent.environment.get("/extensions/weather")
        if agent.environment.has("/extensions/weather")
        else {}
    )
    print(f"environment /extensions/weather: {weather}")
    missing = [city for city in ("paris", "tokyo") if city not in weather]
    if missing:
        print(f"not checked by the model: {', '.join(missing)}")
    print(f"facts: {agent.environment.knowledge.discovered_facts}")


if __name__ == "__main__":
    asyncio.run(main())
