"""A coding agent over a workspace: it explores a project, records a typed design, writes code.

The scenario of the design notes' "coding agent": a project (``hal``) whose structure the
agent maps with ``directory_tree`` (the result fills ``environment.workspace.files``), whose
files it reads, and for which it records a design as a typed extension (``code_design``)
before writing a new module. Writes need approval; this script approves writes under
``src/`` only, as a careful user would.

    python examples/coding_agent.py

Uses a scripted model unless OPENAI_BASE_URL or OPENAI_API_KEY is set (then OPENAI_MODEL,
default gpt-4o-mini, gets the same tools and task).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path

from pydantic import BaseModel

from agent_flow import (
    AgentConfig,
    AgentExecutor,
    ContextConfig,
    Environment,
    SystemState,
    TaskState,
    TaskStatus,
)
from agent_flow.llm import LLMClient, OpenAIClient
from agent_flow.testing import ScriptedLLM, ScriptStep, call, reply
from agent_flow.tools import (
    ApprovalRequest,
    ApprovalResponse,
    ToolContext,
    ToolExecutor,
    Workspace,
    tool,
    workspace_tools,
)

PROJECT = {
    "Cargo.toml": '[package]\nname = "hal"\nversion = "0.1.0"\n',
    "src/lib.rs": "pub mod agent_flow;\npub mod coder;\n",
    "src/agent_flow/mod.rs": "//! agent_flow: the agent loop.\n// TODO: an Environment struct\n",
    "src/coder/executor.rs": "pub struct Executor;\n",
    "src/coder/session.rs": "pub struct Session;\n",
    "docs/agent-loop.md": "# The agent loop\n\nThe environment holds state as JSON and is\n"
    "updated from tool results (directory_tree, search).\n",
}


class FieldDefinition(BaseModel):
    name: str
    field_type: str
    description: str


class StructDefinition(BaseModel):
    name: str
    fields: list[FieldDefinition]
    methods: list[str]


class CodeDesign(BaseModel):
    structs: list[StructDefinition]
    design_patterns: list[str]


@tool
async def record_design(design: CodeDesign, context: ToolContext) -> str:
    """Record the design of the code about to be written, for later steps to follow.

    Args:
        design: The structs to write and the patterns they use.
    """
    assert context.environment is not None
    context.environment.set_extension("code_design", design)
    return f"recorded a design with {len(design.structs)} struct(s)"


DESIGN = CodeDesign(
    structs=[
        StructDefinition(
            name="Environment",
            fields=[
                FieldDefinition(
                    name="state",
                    field_type="serde_json::Value",
                    description="The underlying data store for environment state",
                )
            ],
            methods=["update_from_tool_result(&mut self, tool_name: &str, result: &str)"],
        )
    ],
    design_patterns=["Observer pattern for tool result updates"],
)

ENVIRONMENT_RS = """use serde_json::Value;

/// The agent's working memory, updated from tool results.
pub struct Environment {
    /// The underlying data store for environment state.
    pub state: Value,
}
"""

SCRIPT: list[ScriptStep] = [
    reply("Let me map the project first.", tool_calls=[call("directory_tree", path=".")]),
    reply(
        "The agent_flow module is a stub. Reading it and the design notes.",
        tool_calls=[
            call("read_file", path="src/agent_flow/mod.rs"),
            call("read_file", path="docs/agent-loop.md"),
        ],
    ),
    reply(
        "Recording the design before writing code.",
        tool_calls=[call("record_design", design=DESIGN.model_dump())],
    ),
    reply(
        "Writing the module.",
        tool_calls=[
            call("write_file", path="src/agent_flow/environment.rs", content=ENVIRONMENT_RS)
        ],
    ),
    reply(
        tool_calls=[
            call("task_completion", summary="Added src/agent_flow/environment.rs per the design.")
        ]
    ),
]


def choose_model(script: list[ScriptStep]) -> LLMClient:
    """A real model when OPENAI_BASE_URL or OPENAI_API_KEY is set, else the scripted one."""
    if os.environ.get("OPENAI_BASE_URL") or os.environ.get("OPENAI_API_KEY"):
        return OpenAIClient(os.environ.get("OPENAI_MODEL", "gpt-4o-mini"))
    return ScriptedLLM(script)


async def approve_writes_in_src(request: ApprovalRequest) -> ApprovalResponse:
    path = str(request.arguments.get("path", ""))
    approved = request.tool_name == "write_file" and path.startswith("src/")
    print(f"  approval: {request.tool_name} {path or request.arguments} -> {approved}")
    return ApprovalResponse(approved=approved, reason="" if approved else "only writes in src/")


async def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="hal-")) / "hal"
    for relative, text in PROJECT.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text)

    environment = (
        Environment.builder()
        .system(
            SystemState(
                working_directory=str(root),
                permissions=["read", "write", "execute"],
                resources={"memory_limit": "8GB", "timeout": "3600s"},
            )
        )
        .task(
            TaskState(
                objective="Implement Environment struct for agent_flow module",
                status=TaskStatus.IN_PROGRESS,
                steps_total=4,
                current_step="Explore project structure",
            )
        )
        .build()
    )
    tools = ToolExecutor([*workspace_tools(Workspace(root)), record_design])
    llm = choose_model(SCRIPT)
    print(f"model: {type(llm).__name__}")
    agent = AgentExecutor(
        llm,
        config=AgentConfig(context=ContextConfig(max_tokens=16_000)),
        tools=tools,
        environment=environment,
        approval=approve_writes_in_src,
    )
    outcome = await agent.run(environment.task.objective)

    print(f"outcome: {outcome.stop_reason.value}: {outcome.final_text}")
    print(f"tool calls: {', '.join(use.name for use in outcome.tool_uses)}")
    files = sorted(
        path for path, info in agent.environment.workspace.files.items() if info.kind == "file"
    )
    print(f"files known to the environment: {', '.join(files)}")
    if agent.environment.has("/extensions/code_design"):
        design = agent.environment.get_extension("code_design", CodeDesign)
        print(f"designing struct: {design.structs[0].name} ({design.design_patterns[0]})")
    written = root / "src" / "agent_flow" / "environment.rs"
    print(f"wrote {written.relative_to(root)}: {written.exists()}")


if __name__ == "__main__":
    asyncio.run(main())
