"""Counting the environment from its blocks: exact where the counter splits at headings.

`splits_at_headings` lets the renderer and the system message reuse the counts of the
environment's ``## `` blocks instead of counting the whole text after each change. These
tests check the property itself on each tiktoken encoding that claims it, that the counts
built from parts equal whole counts, and that a change is counted by what it changed.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_flow.context import ContextManager
from agent_flow.environment import Environment, KnowledgeBase, TaskState
from agent_flow.history import History, UserMessage
from agent_flow.testing.strategies import environments
from agent_flow.tokens import ApproxCounter, TiktokenCounter, splits_at_headings

ENCODINGS = ["cl100k_base", "o200k_base", "o200k_harmony"]

# Texts rich in what pre-tokenizers treat specially: runs of spaces and line breaks,
# punctuation and '#', digits, contractions, letters of several scripts.
_PIECES = st.sampled_from(
    ["\n", "\n\n", "\r\n", " ", "  ", "\t", "#", "##", "}", "]", '"', "'s", "'ll", ":", "/",
     "a", "Zz", "é", "ß", "日本", "1", "123", "4567", "{", ",", "-", "…", "🙂", ".", "x y"]
)  # fmt: skip
_TEXTS = st.lists(_PIECES | st.text(max_size=6), max_size=12).map("".join)


@pytest.fixture(scope="module", params=ENCODINGS)
def counter(request: pytest.FixtureRequest) -> TiktokenCounter:
    return TiktokenCounter(encoding=request.param)


@settings(max_examples=300)
@given(before=_TEXTS, after=_TEXTS, breaks=st.sampled_from(["\n", "\n\n", " \n", "\r\n"]))
def test_a_line_break_before_a_hash_always_splits_tokens(
    counter: TiktokenCounter, before: str, after: str, breaks: str
) -> None:
    assert splits_at_headings(counter)
    left, right = before + breaks, "#" + after
    assert counter.count(left + right) == counter.count(left) + counter.count(right)


def test_only_counters_that_say_so_split_at_headings() -> None:
    class Splitting(ApproxCounter):
        splits_at_headings = True

    assert splits_at_headings(TiktokenCounter())
    assert not splits_at_headings(ApproxCounter())
    assert splits_at_headings(Splitting())


@settings(max_examples=60, deadline=None)
@given(
    env=environments(max_items=10, max_text=80),
    budget=st.integers(0, 400),
    head=st.sampled_from(["", "You help.\n", "{task}Rules:\n\n", "Be brief:"]),
    tail=st.sampled_from(["", "\n", "\nAnswer in English.", " end", "\n\n## After\nmore"]),
    encoding=st.sampled_from(ENCODINGS),
)
def test_prompts_counted_from_the_environments_parts_are_exact(
    env: Environment, budget: int, head: str, tail: str, encoding: str
) -> None:
    counter = TiktokenCounter(encoding=encoding)
    report = env.render_report(budget, counter)
    assert report.tokens == counter.count(report.text)
    history = History(counter=counter)
    history.add(UserMessage(content="Fix the parser."))
    manager = ContextManager(
        env,
        history,
        budget + 200,
        counter=counter,
        reserve_output_tokens=0,
        system_prompt_template=head + "{environment}" + tail,
    )
    prompt = manager.build_prompt()
    assert prompt.total_tokens == counter.count_messages(list(prompt.messages))
    system = prompt.messages[0]
    assert prompt.breakdown.system_template + prompt.breakdown.environment == (
        counter.count_message(system)
    )


class _Recording(TiktokenCounter):
    """A tiktoken counter that remembers the length of every text it counts."""

    def __init__(self) -> None:
        super().__init__()
        self.lengths: list[int] = []

    def count(self, text: str) -> int:
        self.lengths.append(len(text))
        return super().count(text)


def test_a_change_is_counted_by_what_it_changed_not_by_the_whole_environment() -> None:
    facts = [f"fact {n}: the parser handles case {n} of the grammar" for n in range(200)]
    env = Environment(
        task=TaskState(objective="Fix the parser"),
        knowledge=KnowledgeBase(discovered_facts=facts),
    )
    counter = _Recording()
    history = History(counter=counter)
    history.add(UserMessage(content="Fix the parser."))
    template = "You help.\n{environment}\nAnswer briefly."
    manager = ContextManager(env, history, 60_000, counter=counter, system_prompt_template=template)
    manager.build_prompt()
    # The first write adds a block after the knowledge: its count with the blank line after
    # it is taken once, then kept.
    env.set("/extensions/latest", {"step": -1, "result": "ok"})
    whole = len(manager.build_prompt().messages[0].content)
    for step in range(5):
        counter.lengths.clear()
        env.set("/extensions/latest", {"step": step, "result": "ok"})
        prompt = manager.build_prompt()
        assert prompt.total_tokens == TiktokenCounter().count_messages(list(prompt.messages))
        # Nothing near the environment's size was counted again: only the changed block,
        # its seams and the template around it.
        assert max(counter.lengths) < whole // 10, (max(counter.lengths), whole)
