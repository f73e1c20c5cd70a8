"""The ``lab`` command's arguments, apart from the command so that ``--help`` stays light."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING

from agent_flow._defaults import PRUNING_STRATEGIES

if TYPE_CHECKING:
    from agent_flow.pricing import Pricing

__all__ = ["add_lab_arguments"]


def add_lab_arguments(parser: argparse.ArgumentParser, *, seconds: Callable[[str], float]) -> None:
    """The ``lab`` command's arguments (its ``--db`` and ``--config`` come from the parent).

    `seconds` reads a number of seconds (``--timeout``), as the other commands do.
    """
    parser.add_argument(
        "sessions",
        nargs="+",
        metavar="SESSION",
        help="a stored session's id, or a JSON-lines export (agent-flow sessions export)",
    )
    parser.add_argument(
        "--delegated",
        action="store_true",
        help="also replay each run the sessions delegated to a sub-agent, as a session of its own",
    )
    parser.add_argument(
        "--candidates",
        metavar="FILE",
        help="a lab file of [[candidate]] tables, or an agent.toml whose [agent.context] to try",
    )
    parser.add_argument(
        "--strategy",
        action="append",
        default=[],
        choices=PRUNING_STRATEGIES,
        help="a strategy to try with every --budget (repeatable; default: all four); "
        "summarize is replayed with the offline extractive summarizer",
    )
    parser.add_argument(
        "--budget",
        action="append",
        default=[],
        type=_budget,
        metavar="TOKENS",
        help="a max_tokens budget to try with every --strategy (repeatable)",
    )
    parser.add_argument(
        "--reserve", type=int, metavar="TOKENS", help="output reserve of --budget candidates"
    )
    parser.add_argument(
        "--window-turns", type=_budget, default=8, help="turns kept by sliding_window (8)"
    )
    parser.add_argument(
        "--probe",
        action="append",
        default=[],
        metavar="TEXT",
        help="a string whose presence in each prompt to track (repeatable)",
    )
    parser.add_argument("--model", help="price the prompts as this model (default: the session's)")
    parser.add_argument(
        "--pricing",
        type=_pricing,
        metavar="IN,OUT",
        help="price per million input and output tokens in USD, for a model without known prices",
    )
    ask = parser.add_argument_group(
        "re-asking (optional, needs a live model; its scores are model-dependent)"
    )
    ask.add_argument(
        "--ask",
        action="store_true",
        help="send each candidate's last prompt to the model (--model, --base-url) and score "
        "its answer against the recorded final answer",
    )
    ask.add_argument("--base-url", help="the OpenAI-compatible endpoint (default $OPENAI_BASE_URL)")
    ask.add_argument(
        "--api-key-env",
        default="OPENAI_API_KEY",
        metavar="NAME",
        help="the variable holding the API key (default OPENAI_API_KEY)",
    )
    ask.add_argument(
        "--timeout",
        type=seconds,
        metavar="SECONDS",
        help="the most one re-asked prompt may take (default 600)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--html", metavar="FILE", help="write the HTML report with plots here")


def _budget(text: str) -> int:
    try:
        value = int(text.replace("_", "").replace(",", ""))
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of tokens") from err
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def _pricing(text: str) -> Pricing:
    from agent_flow.pricing import Pricing

    try:
        input_price, output_price = (float(part) for part in text.split(","))
    except ValueError as err:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not IN,OUT prices per million tokens (e.g. 0.15,0.60)"
        ) from err
    if input_price < 0 or output_price < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: prices cannot be negative")
    return Pricing(input_per_million=input_price, output_per_million=output_price)
