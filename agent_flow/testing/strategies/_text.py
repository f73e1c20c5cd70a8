"""The characters the strategies draw text from, and the settings profile to run them with.

Texts are drawn from `ALPHABET`, a fixed set of characters chosen for what breaks code around
a prompt: JSON escapes (quote, backslash, control characters, U+2028), pointer escapes (``~``,
``/``), the renderer's marker (``…``), and text a tokenizer splits in odd places (accents,
CJK, an emoji outside the basic plane, a combining mark, a zero-width joiner). Drawing from
full unicode would find little more here and costs a second or more on the first draw of a
fresh checkout, while hypothesis builds its unicode tables; that time counts against the
first examples and fails ``HealthCheck.too_slow`` on a busy machine.

`PROFILE` names the settings profile registered on import: no deadline (a loaded machine makes
timings meaningless) and no ``too_slow`` health check. Load it in ``conftest.py`` (or at the
top of a test module) with ``settings.load_profile("agent_flow")``.
"""

from __future__ import annotations

import string
from typing import Final

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

__all__ = ["ALPHABET", "PROFILE", "identifiers", "names", "texts"]

#: The characters `texts` draws from; failing examples shrink towards the first ones.
ALPHABET: Final = (
    "ab01 ._-~/…,:{}[]\"'\\\n\t\r\x00\x1f\x7f\u00a0\u2028\ufefféßλж中文한😀\u0301\u200d\u05d0"
)

#: The settings profile for property tests of agent_flow code (see the module doc).
PROFILE: Final = "agent_flow"

settings.register_profile(PROFILE, deadline=None, suppress_health_check=[HealthCheck.too_slow])

_CHARACTERS = st.sampled_from(ALPHABET)
_LOWER = st.sampled_from(string.ascii_lowercase)
_NAME_CHARACTERS = st.sampled_from(string.ascii_lowercase + string.digits + "_")
_LABEL_CHARACTERS = st.sampled_from(string.ascii_letters + string.digits + "_-.éλ中")


def texts(*, min_size: int = 0, max_size: int | None = None) -> st.SearchStrategy[str]:
    """Strings of `ALPHABET` characters."""
    return st.text(_CHARACTERS, min_size=min_size, max_size=max_size)


def identifiers(*, max_size: int = 21) -> st.SearchStrategy[str]:
    """Names as providers accept them for tools: a lowercase letter, then ``[a-z0-9_]``."""
    return st.builds(str.__add__, _LOWER, st.text(_NAME_CHARACTERS, max_size=max(0, max_size - 1)))


def names(*, max_size: int = 20) -> st.SearchStrategy[str]:
    """Names as MCP servers may give them: letters (some non-ASCII), digits and ``_-.``."""
    return st.text(_LABEL_CHARACTERS, min_size=1, max_size=max_size)
