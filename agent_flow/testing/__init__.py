"""Testing agent_flow code, and code written for it: model doubles, invariants, strategies.

- `scripted`: `ScriptedLLM` and `FunctionLLM`, models that answer from a script or a function
  and record every request, so an agent runs end to end without a server;
- `invariants`: the checks a prompt, a pruned history and a rendered environment must pass
  (`assert_prompt_within_budget`, `assert_units_intact`, `assert_pinned_kept`,
  `assert_render_within`), each naming the provider error it prevents, and the checks that
  run your own pruning strategy or result handlers on their own
  (`assert_strategy_within_budget`, `assert_handlers_apply`);
- `strategies` (import it as ``agent_flow.testing.strategies``; it needs hypothesis, the
  ``agent-flow[testing]`` extra): hypothesis strategies for environments, histories, tool
  definitions, budgets and whole `ContextManager` setups, and the settings profile
  ``"agent_flow"`` to run them with.

Everything here but `strategies` needs nothing beyond agent_flow itself, so the doubles can be
used where hypothesis is not installed.
"""

from __future__ import annotations

from agent_flow.testing.invariants import (
    assert_handlers_apply,
    assert_pinned_kept,
    assert_prompt_within_budget,
    assert_render_within,
    assert_strategy_within_budget,
    assert_units_intact,
)
from agent_flow.testing.scripted import (
    FunctionLLM,
    Reply,
    ScriptedCall,
    ScriptedFailure,
    ScriptedLLM,
    ScriptedReply,
    ScriptExhaustedError,
    ScriptStep,
    call,
    fail,
    reply,
)

__all__ = [
    "FunctionLLM",
    "Reply",
    "ScriptExhaustedError",
    "ScriptStep",
    "ScriptedCall",
    "ScriptedFailure",
    "ScriptedLLM",
    "ScriptedReply",
    "assert_handlers_apply",
    "assert_pinned_kept",
    "assert_prompt_within_budget",
    "assert_render_within",
    "assert_strategy_within_budget",
    "assert_units_intact",
    "call",
    "fail",
    "reply",
]
