"""``--agent MODULE:ATTR``: the user's own agent, defined in Python, run from the command line.

The attribute is an `AgentExecutor` (its model, tools, handlers and config are used as they
are), an `AgentConfig` (the command builds the model and tools from it, flags on top), or a
function returning either (a coroutine function is awaited). A function with an ``llm``
parameter is given the model the flags describe (``--model``, ``--base-url``, ``--provider``,
``--api-key-env``, ``--timeout``) when any of them is given, so one Python agent runs against
any server from the command line::

    def build_agent(llm: LLMClient | None = None) -> AgentExecutor:
        return AgentExecutor(llm or OpenAIClient("gpt-4o-mini"), tools=...)

Otherwise it is called with no arguments.
MODULE is a module name importable from the current directory (``my_agents``,
``pkg.agents``) or a path to a ``.py`` file (``examples/custom_tool.py``). That is how
Python-defined tools and result handlers reach `run`, `chat` and `tools`.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from agent_flow.agent import AgentExecutor
from agent_flow.config import AgentConfig
from agent_flow.errors import UserError
from agent_flow.llm.base import LLMClient

UserAgent = AgentExecutor | AgentConfig


def _import(spec: str, module_name: str) -> ModuleType:
    if module_name.endswith(".py") or os.sep in module_name or "/" in module_name:
        path = Path(module_name)
        if not path.is_file():
            raise UserError(f"--agent {spec!r}: {module_name} is not a file")
        name = f"agent_flow_user_agent_{path.stem}"
        loader_spec = importlib.util.spec_from_file_location(name, path)
        if loader_spec is None or loader_spec.loader is None:
            raise UserError(f"--agent {spec!r}: {module_name} cannot be imported")
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[name] = module
        # Its own imports of sibling modules work as when it is run as a script.
        sys.path.insert(0, str(path.resolve().parent))
        loader_spec.loader.exec_module(module)
        return module
    # As `python -m`: modules in the current directory are importable.
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name is not None and module_name.startswith(err.name):
            raise UserError(
                f"--agent {spec!r}: there is no module {module_name!r} here; run from the "
                "directory that holds it, add that directory to PYTHONPATH, or give the "
                "path of the .py file"
            ) from err
        raise


def _llm_parameter(function: Callable[..., object]) -> inspect.Parameter | None:
    """The function's ``llm`` parameter, if it can be passed by keyword."""
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):  # a builtin or a C callable without a signature
        return None
    parameter = parameters.get("llm")
    if parameter is None or parameter.kind in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.VAR_POSITIONAL,
        inspect.Parameter.VAR_KEYWORD,
    ):
        return None
    return parameter


async def load_user_agent(spec: str, *, llm: Callable[[], LLMClient] | None = None) -> UserAgent:
    """Import and build the agent ``--agent`` names.

    Args:
        spec: ``MODULE:ATTR``.
        llm: Builds the model the flags describe; given to a function with an ``llm``
            parameter (None: no model flag was given).

    Raises:
        UserError: The spec is malformed, the module or attribute does not exist, or it
            gives something other than an agent, a config, or a function returning one.
    """
    module_name, colon, attribute = spec.rpartition(":")
    if not colon or not module_name or not attribute:
        raise UserError(
            f"--agent {spec!r} must be MODULE:ATTRIBUTE, e.g. my_agents:build_agent or "
            "path/to/agents.py:agent"
        )
    try:
        found: object = _import(spec, module_name)
    except UserError:
        raise
    except Exception as err:
        raise UserError(
            f"--agent {spec!r}: importing {module_name} failed: {type(err).__name__}: {err}"
        ) from err
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise UserError(f"--agent {spec!r}: {module_name} has no attribute {attribute!r}")
        found = getattr(found, part)
    if callable(found) and not isinstance(found, AgentExecutor | AgentConfig):
        takes_llm = _llm_parameter(found)
        arguments: dict[str, object] = {}
        if takes_llm is not None and llm is not None:
            arguments["llm"] = llm()
        elif takes_llm is not None and takes_llm.default is inspect.Parameter.empty:
            raise UserError(
                f"--agent {spec!r}: {attribute}() needs its llm; pass --model (and --base-url) "
                "to give it one"
            )
        try:
            found = found(**arguments)
            if inspect.isawaitable(found):
                found = await found
        except Exception as err:
            raise UserError(
                f"--agent {spec!r}: calling {attribute}() failed: {type(err).__name__}: {err}"
            ) from err
    if not isinstance(found, AgentExecutor | AgentConfig):
        raise UserError(
            f"--agent {spec!r} gave {type(found).__name__}; expected an AgentExecutor, an "
            "AgentConfig, or a function returning one"
        )
    return found
