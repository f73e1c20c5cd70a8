"""Re-asking the final question: how a live model answers from each candidate's last prompt.

Optional and **model-dependent**: where a model is configured, the lab sends the prompt a
candidate built for a session's last step (the step whose answer ended the recorded run) to
that model, and scores the answer against the recorded final answer by word overlap (F1 of
the lowercased words, 0..1). The score says how much of the recorded answer the model could
still give from what the candidate kept; another model, or the same one another time, may
score differently, so it is reported apart from the offline numbers.
"""

from __future__ import annotations

import re
from collections import Counter

from agent_flow._defaults import default_reserve_output_tokens
from agent_flow.errors import ModelError
from agent_flow.lab.candidates import Candidate
from agent_flow.lab.recording import RecordedSession, RecordedStep
from agent_flow.lab.replay import replay_session
from agent_flow.lab.report import ReaskedAnswer
from agent_flow.llm.base import LLMClient, LLMRequest
from agent_flow.prompt import Prompt

__all__ = ["answer_overlap", "reask"]

_WORD = re.compile(r"\w+")


def answer_overlap(answer: str, recorded: str) -> float:
    """The F1 of the two texts' lowercased words (1.0: the same words, 0.0: none shared)."""
    mine = Counter(w.lower() for w in _WORD.findall(answer))
    theirs = Counter(w.lower() for w in _WORD.findall(recorded))
    if not mine or not theirs:
        return 1.0 if mine == theirs else 0.0
    common = sum((mine & theirs).values())
    if common == 0:
        return 0.0
    precision = common / sum(mine.values())
    recall = common / sum(theirs.values())
    return 2 * precision * recall / (precision + recall)


async def reask(session: RecordedSession, candidate: Candidate, llm: LLMClient) -> ReaskedAnswer:
    """Send `candidate`'s prompt of the session's last step to `llm` and score the answer.

    A model failure is reported in the result (``error``), not raised: one bad call does not
    lose the rest of the lab run.
    """
    last: list[tuple[RecordedStep, Prompt]] = []
    await replay_session(
        session, candidate, on_prompt=lambda step, prompt: last.append((step, prompt))
    )
    base = {"candidate": candidate.name, "session": session.id, "recorded": session.final_answer}
    if not last or last[-1][0] is not session.steps[-1]:
        return ReaskedAnswer(**base, error="the last step does not fit this candidate's budget")
    step, prompt = last[-1]
    reserve = candidate.reserve_output_tokens
    if reserve is None:
        reserve = default_reserve_output_tokens(candidate.max_tokens)
    try:
        completion = await llm.complete(LLMRequest(messages=prompt.messages, max_tokens=reserve))
    except ModelError as err:
        return ReaskedAnswer(**base, step=step.index, error=f"{type(err).__name__}: {err}")
    answer = completion.text or "; ".join(
        f"{call.name}({call.arguments})" for call in completion.tool_calls
    )
    score = answer_overlap(answer, session.final_answer) if session.final_answer else None
    return ReaskedAnswer(
        **base, step=step.index, answer=answer, score=score, model=completion.model
    )
