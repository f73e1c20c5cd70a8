"""The PostgreSQL server the store tests use, and a fresh schema per test, dropped after.

The server is `URL`: ``AGENT_FLOW_TEST_POSTGRES``, or the local server CI machines run. When no
server answers, the tests that need one skip and say why, except under ``CI=true``, where that
is a failure: CI must always exercise them.
"""

from __future__ import annotations

import os

import pytest

URL = os.environ.get("AGENT_FLOW_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")

_checked: list[str | None] = []


def _problem() -> str | None:
    """Why the server cannot be used (None when it can); asked once per test run."""
    if not _checked:
        try:
            import psycopg

            with psycopg.connect(URL, connect_timeout=3, autocommit=True) as conn:
                conn.execute("SELECT 1")
            _checked.append(None)
        except Exception as err:  # any failure means "no server here"
            _checked.append(f"{type(err).__name__}: {err}".strip())
    return _checked[0]


def require_postgres() -> str:
    """Return the server's URL, or skip the test (fail it under ``CI=true``) saying why not."""
    problem = _problem()
    if problem is not None:
        reason = (
            f"no PostgreSQL server answers at {URL} ({problem}); start one or point "
            "AGENT_FLOW_TEST_POSTGRES at one"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason} (CI=true: these tests must run)", pytrace=False)
        pytest.skip(reason)
    return URL


def drop_schema(schema: str) -> None:
    """Drop `schema` and everything in it."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(URL, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
