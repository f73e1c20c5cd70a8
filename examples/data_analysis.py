"""A data-analysis agent whose datasets live in a typed environment extension.

The design notes' sales scenario: ``read_csv`` loads ``sales_data.csv`` (1,250 rows of date,
product, region, sales, profit) and ``analyze_data`` computes summary statistics. Two result
handlers keep what the agent learns in the extension ``datasets`` — a ``dict[str, Dataset]``
of pydantic models — read back with ``environment.get_extension("datasets", ...)``. The
model sees the extension in every prompt, so later steps need not re-read the raw results.

    python examples/data_analysis.py

Uses a scripted model unless OPENAI_BASE_URL or OPENAI_API_KEY is set (then OPENAI_MODEL,
default gpt-4o-mini, gets the same tools and task). A real model may skip a step or call the
tools in another order: the handlers record whatever comes back, and the report reads the
extension with defaults and says what is missing.
"""

from __future__ import annotations

import asyncio
import csv
import json
import os
import random
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from agent_flow import (
    AgentConfig,
    AgentExecutor,
    ContextConfig,
    Environment,
    SystemState,
    TaskState,
    ToolCall,
)
from agent_flow.errors import ToolError
from agent_flow.llm import LLMClient, LLMRequest, OpenAIClient
from agent_flow.testing import Reply, ScriptedLLM, ScriptStep, call, reply
from agent_flow.tools import HandlerRegistry, ToolExecutor, ToolResult, tool

DATA = Path(tempfile.mkdtemp(prefix="sales-"))


class Dataset(BaseModel):
    name: str
    rows: int
    columns: list[str]
    summary_stats: dict[str, Any] = Field(default_factory=dict)


def write_sales_data(path: Path, rows: int = 1250) -> None:
    pick = random.Random(2025)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["date", "product", "region", "sales", "profit"])
        for day in range(rows):
            sales = pick.randrange(200, 2000)
            writer.writerow(
                [
                    f"2025-{1 + day % 12:02d}-{1 + day % 28:02d}",
                    pick.choice(["WidgetA", "WidgetB", "Gadget"]),
                    pick.choice(["North", "South", "East", "West"]),
                    sales,
                    round(sales * pick.uniform(0.2, 0.35)),
                ]
            )


def load(path: str) -> list[dict[str, str]]:
    file = DATA / path
    if not file.is_file():
        # A ToolError is an answer the model can act on, not a crash of the tool.
        there = ", ".join(sorted(p.name for p in DATA.glob("*.csv"))) or "nothing"
        raise ToolError(f"no file {path!r} in the data directory; it has: {there}")
    with file.open(newline="") as handle:
        return list(csv.DictReader(handle))


@tool
def read_csv(path: str) -> ToolResult:
    """Load a CSV file: its size, columns and a sample of rows.

    Args:
        path: The file, relative to the data directory.
    """
    rows = load(path)
    data: dict[str, Any] = {
        "path": path,
        "rows": len(rows),
        "columns": list(rows[0]),
        "sample": [dict(row) for row in rows[:2]],
    }
    return ToolResult(content=json.dumps(data), data=data)


@tool
def analyze_data(dataset: str) -> ToolResult:
    """Summary statistics of a sales CSV: total sales, profit margin, sales by region.

    Args:
        dataset: The CSV file, relative to the data directory.
    """
    rows = load(dataset)
    by_region: dict[str, int] = defaultdict(int)
    for row in rows:
        by_region[row["region"]] += int(row["sales"])
    total = sum(int(row["sales"]) for row in rows)
    profit = sum(int(row["profit"]) for row in rows)
    stats: dict[str, Any] = {
        "total_sales": total,
        "avg_profit_margin": round(profit / total, 3),
        "sales_by_region": dict(sorted(by_region.items())),
    }
    data: dict[str, Any] = {
        "dataset": dataset,
        "rows": len(rows),
        "columns": list(rows[0]) if rows else [],
        "summary_stats": stats,
    }
    return ToolResult(content=json.dumps(data), data=data)


def known_datasets(env: Environment) -> dict[str, Dataset]:
    """The ``datasets`` extension, empty until a tool result has filled it."""
    if not env.has("/extensions/datasets"):
        return {}
    return env.get_extension("datasets", dict[str, Dataset])


def save_datasets(env: Environment, datasets: dict[str, Dataset]) -> None:
    env.set_extension("datasets", {key: value.model_dump() for key, value in datasets.items()})


def dataset_loaded(env: Environment, call: ToolCall, result: ToolResult) -> None:
    """read_csv: register the dataset in the typed extension."""
    data = result.data
    if result.is_error or not isinstance(data, dict):
        return  # a file that could not be read: the model sees the error
    datasets = known_datasets(env)
    name = Path(str(data["path"])).stem
    stats = datasets[name].summary_stats if name in datasets else {}
    datasets[name] = Dataset(
        name=name, rows=data["rows"], columns=data["columns"], summary_stats=stats
    )
    save_datasets(env, datasets)


def stats_computed(env: Environment, call: ToolCall, result: ToolResult) -> None:
    """analyze_data: store the statistics with their dataset (registered if it was not)."""
    data = result.data
    if result.is_error or not isinstance(data, dict):
        return
    datasets = known_datasets(env)
    name = Path(str(data["dataset"])).stem
    # A model may analyze without loading first: the statistics still have a home.
    dataset = datasets.get(name) or Dataset(
        name=name, rows=int(data.get("rows", 0)), columns=list(data.get("columns", []))
    )
    datasets[name] = dataset.model_copy(update={"summary_stats": data["summary_stats"]})
    save_datasets(env, datasets)


def write_report(request: LLMRequest) -> Reply:
    """The scripted model's last step: a report from the statistics it was sent."""
    analysis = next(m.content for m in reversed(request.messages) if "total_sales" in m.content)
    stats = json.loads(analysis)["summary_stats"]
    best = max(stats["sales_by_region"], key=stats["sales_by_region"].get)
    return reply(
        tool_calls=[
            call(
                "task_completion",
                summary=f"Total sales {stats['total_sales']:,}, average profit margin "
                f"{stats['avg_profit_margin']:.1%}; {best} sells the most.",
                result=stats,
            )
        ]
    )


SCRIPT: list[ScriptStep] = [
    reply("Loading the data.", tool_calls=[call("read_csv", path="sales_data.csv")]),
    reply("1,250 rows. Analyzing.", tool_calls=[call("analyze_data", dataset="sales_data.csv")]),
    write_report,
]


def choose_model(script: list[ScriptStep]) -> LLMClient:
    """A real model when OPENAI_BASE_URL or OPENAI_API_KEY is set, else the scripted one."""
    if os.environ.get("OPENAI_BASE_URL") or os.environ.get("OPENAI_API_KEY"):
        return OpenAIClient(os.environ.get("OPENAI_MODEL", "gpt-4o-mini"))
    return ScriptedLLM(script)


async def main() -> None:
    write_sales_data(DATA / "sales_data.csv")
    handlers = HandlerRegistry.with_defaults()
    handlers.register("read_csv", dataset_loaded)
    handlers.register("analyze_data", stats_computed)
    environment = (
        Environment.builder()
        .system(SystemState(working_directory=str(DATA), permissions=["read", "write"]))
        .task(
            TaskState(
                objective="Analyze sales data and create a report",
                steps_total=3,
                current_step="Load and explore data",
            )
        )
        .build()
    )
    llm = choose_model(SCRIPT)
    print(f"model: {type(llm).__name__}")
    agent = AgentExecutor(
        llm,
        config=AgentConfig(context=ContextConfig(max_tokens=16_000)),
        tools=ToolExecutor([read_csv, analyze_data], handlers=handlers),
        environment=environment,
    )
    outcome = await agent.run("Analyze sales_data.csv and report the key figures.")

    print(f"outcome: {outcome.stop_reason.value}: {outcome.final_text}")
    # Read with defaults: a real model may have skipped a step or named the file otherwise.
    datasets = known_datasets(agent.environment)
    sales = datasets.get("sales_data")
    if sales is None:
        print(f"the model did not load sales_data.csv (datasets known: {sorted(datasets)})")
    else:
        if sales.rows:
            columns = ", ".join(sales.columns)
            print(f"Analyzing {sales.rows} rows of sales data; columns: {columns}")
        if sales.summary_stats:
            print(f"summary stats: {json.dumps(sales.summary_stats, sort_keys=True)}")
        else:
            print("the model did not analyze sales_data.csv (no summary stats)")
    print(f"task status: {agent.environment.task.status.value}")


if __name__ == "__main__":
    asyncio.run(main())
