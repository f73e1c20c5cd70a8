from __future__ import annotations

import importlib

import pytest

PUBLIC_MODULES = [
    "agent_flow",
    "agent_flow.agent",
    "agent_flow.config",
    "agent_flow.context",
    "agent_flow.delegation",
    "agent_flow.environment",
    "agent_flow.errors",
    "agent_flow.events",
    "agent_flow.history",
    "agent_flow.lab",
    "agent_flow.llm",
    "agent_flow.messages",
    "agent_flow.prompt",
    "agent_flow.sessions",
    "agent_flow.sessions.diff",
    "agent_flow.testing",
    "agent_flow.testing.strategies",
    "agent_flow.tokens",
    "agent_flow.tools",
]


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_all_lists_exactly_the_public_names_and_each_one_exists(name: str) -> None:
    module = importlib.import_module(name)
    exported = module.__all__
    assert len(exported) == len(set(exported)), "duplicates in __all__"
    for member in exported:
        assert hasattr(module, member), f"{name}.__all__ names missing {member!r}"


def test_the_top_level_package_exports_what_it_imports_publicly() -> None:
    import agent_flow

    public = {
        n
        for n, v in vars(agent_flow).items()
        if not n.startswith("_") and not isinstance(v, type(importlib)) and n != "annotations"
    }
    assert public <= set(agent_flow.__all__)
