"""`Trace`: the SQL statements a SQLite store runs, collected for a test to count."""

from __future__ import annotations


class Trace:
    """Collects the SQL a store runs (called on the store's worker thread)."""

    def __init__(self) -> None:
        self.statements: list[str] = []

    def __call__(self, statement: str) -> None:
        self.statements.append(statement)

    def take(self) -> list[str]:
        taken, self.statements = self.statements, []
        return taken
