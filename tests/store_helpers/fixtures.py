"""The store fixtures of the conformance suites: ``kind``, ``store``, ``backing``, ``any_backing``.

A test module imports them (``from tests.store_helpers.fixtures import backing, kind, store``)
to run each of its tests on every store: memory, SQLite and PostgreSQL (``backing``: the two
that several store objects can share; ``any_backing``: all three, for hypothesis tests that
open their own store per example).
"""

from __future__ import annotations

import typing
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from agent_flow.sessions import SessionStore
from tests.store_helpers.backing import Backing

KINDS = ["memory", "sqlite", "postgres"]
SHARED_KINDS = ["sqlite", "postgres"]


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return typing.cast(str, request.param)


@pytest.fixture
async def store(kind: str, tmp_path: Path) -> AsyncIterator[SessionStore]:
    backing = Backing(kind, tmp_path)
    try:
        async with backing.open() as made:
            yield made
    finally:
        backing.drop()


def _backing(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backing]:
    made = Backing(typing.cast(str, request.param), tmp_path)
    try:
        yield made
    finally:
        made.drop()


backing = pytest.fixture(params=SHARED_KINDS, name="backing")(_backing)
any_backing = pytest.fixture(params=KINDS, name="any_backing")(_backing)
