"""Hypothesis strategies for agent_flow's data, to property-test your own code against it.

Needs hypothesis: ``pip install 'agent-flow[testing]'``. The strategies draw only states a real
agent can reach, and shrink to small, readable examples (short histories of a few words,
budgets near the edge, environments of a few entries):

- environments: `environments` (typed sections, free-form extensions and, with
  ``extensions={"name": YourModel}``, your own extension models), the sections alone
  (`system_states`, `task_states`, `knowledge_bases`, `workspace_states`, ...),
  `extension_values`, `json_values`, `pointer_writes`;
- histories: `entry_lists` (valid sequences of whole units: answered calls, parallel calls,
  summaries, thinking), `histories`, `history_entries` (any single entry), `prose`;
- pruning: `pruning_strategies` (the built-in ones and chains), `summarize_steps`;
- around a prompt: `tool_definitions`, `tool_sets`, `answered_calls` (a call and its result,
  for result handlers), `budgets`, `budgets_around` (for pruning given units, a third on
  the `budget_edges` where an off-by-one shows), `allocations`, and `context_managers`, a
  whole `ContextManager` setup;
- text: `texts`, `identifiers` and `names` draw from `ALPHABET`, a fixed set of awkward
  characters (JSON and pointer escapes, non-ASCII, an emoji, a combining mark).

Run them under the settings profile registered here, `PROFILE` (``"agent_flow"``: no
deadline, no ``too_slow`` health check), with ``settings.load_profile("agent_flow")`` in
your ``conftest.py``: a loaded 2-core machine otherwise fails tests on timing alone.

Check what your code made with the invariants of `agent_flow.testing`
(`assert_prompt_within_budget`, `assert_units_intact`, `assert_pinned_kept`,
`assert_render_within`) and check your own strategies and handlers on their own with
`assert_strategy_within_budget` and `assert_handlers_apply`; the README shows a complete
test file to copy.
"""

from __future__ import annotations

try:
    import hypothesis  # noqa: F401  (checked here to say what to install)
except ImportError as err:  # pragma: no cover - hypothesis is installed wherever tests run
    raise ImportError(
        "agent_flow.testing.strategies needs hypothesis; install it with "
        "pip install 'agent-flow[testing]'"
    ) from err

from agent_flow.testing.strategies._environment import (
    artifact_infos,
    environments,
    extension_values,
    file_infos,
    json_keys,
    json_values,
    knowledge_bases,
    plan_steps,
    pointer_writes,
    system_states,
    task_states,
    workspace_states,
)
from agent_flow.testing.strategies._history import (
    entry_lists,
    histories,
    history_entries,
    prose,
    pruning_strategies,
    summarize_steps,
    timestamps,
)
from agent_flow.testing.strategies._setup import (
    allocations,
    answered_calls,
    budget_edges,
    budgets,
    budgets_around,
    context_managers,
    tool_definitions,
    tool_sets,
)
from agent_flow.testing.strategies._text import ALPHABET, PROFILE, identifiers, names, texts

__all__ = [
    "ALPHABET",
    "PROFILE",
    "allocations",
    "answered_calls",
    "artifact_infos",
    "budget_edges",
    "budgets",
    "budgets_around",
    "context_managers",
    "entry_lists",
    "environments",
    "extension_values",
    "file_infos",
    "histories",
    "history_entries",
    "identifiers",
    "json_keys",
    "json_values",
    "knowledge_bases",
    "names",
    "plan_steps",
    "pointer_writes",
    "prose",
    "pruning_strategies",
    "summarize_steps",
    "system_states",
    "task_states",
    "texts",
    "timestamps",
    "tool_definitions",
    "tool_sets",
    "workspace_states",
]
