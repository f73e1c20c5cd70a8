"""A private PostgreSQL server for the tests that restart or break one: never the machine's.

`PrivatePostgres` makes a cluster with ``initdb`` in a temporary directory, runs it on a free
loopback port with its socket in that directory, and removes it all when stopped. PostgreSQL
refuses to run as root: as root, the cluster belongs to the ``postgres`` system user and its
commands run through ``runuser``. `private_postgres_or_skip` says why a machine cannot (no
``initdb``, root without a ``postgres`` user); under ``CI=true`` that is a failure.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server_harness import free_port


def _binary(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    root = Path("/usr/lib/postgresql")
    if root.is_dir():
        for version in sorted(root.iterdir(), reverse=True):
            candidate = version / "bin" / name
            if candidate.exists():
                return str(candidate)
    return None


class PrivatePostgres:
    """One PostgreSQL cluster of the test's own (see the module doc)."""

    def __init__(
        self, *, listen: tuple[str, ...] = ("127.0.0.1",), trust: tuple[str, ...] = ()
    ) -> None:
        """Make the cluster (not started): it listens on `listen` and trusts `trust` (CIDRs)."""
        self._listen = ",".join(listen)
        initdb, pg_ctl = _binary("initdb"), _binary("pg_ctl")
        assert initdb is not None and pg_ctl is not None
        self._pg_ctl = pg_ctl
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="af-pg-"))
        self._user: list[str] = []
        if os.geteuid() == 0:
            owner = pwd.getpwnam("postgres")
            os.chown(self.dir, owner.pw_uid, owner.pw_gid)
            self._user = ["runuser", "-u", "postgres", "--"]
        self._run(
            initdb, "-D", str(self.dir / "data"), "-A", "trust", "-U", "postgres", "--no-sync"
        )
        with (self.dir / "data" / "pg_hba.conf").open("a") as hba:
            for network in trust:
                hba.write(f"host all all {network} trust\n")

    def _run(self, *args: str) -> None:
        subprocess.run([*self._user, *args], check=True, capture_output=True, timeout=120)

    def url(self, database: str = "postgres", host: str = "127.0.0.1") -> str:
        return f"postgresql://postgres@{host}:{self.port}/{database}"

    def start(self) -> None:
        options = (
            f"-p {self.port} -k {self.dir} -c listen_addresses={self._listen} -c fsync=off "
            # A peer cut off (its link down) is found within seconds, its locks released.
            "-c max_connections=200 -c tcp_keepalives_idle=1 -c tcp_keepalives_interval=1 "
            "-c tcp_keepalives_count=3"
        )
        self._run(
            self._pg_ctl,
            "-D",
            str(self.dir / "data"),
            "-o",
            options,
            "-l",
            str(self.dir / "log"),
            "-w",
            "-t",
            "60",
            "start",
        )

    def stop(self, mode: str = "fast") -> None:
        self._run(self._pg_ctl, "-D", str(self.dir / "data"), "-m", mode, "-w", "stop")

    def create_database(self, name: str) -> str:
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.url(name)

    def remove(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):  # not running
            self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)


def private_postgres_or_skip(**options: tuple[str, ...]) -> PrivatePostgres:
    """A started private cluster, or skip (fail under ``CI=true``) saying why there is none.

    `options`: those of `PrivatePostgres`.
    """
    problem = None
    if _binary("initdb") is None or _binary("pg_ctl") is None:
        problem = "PostgreSQL's initdb and pg_ctl are not installed"
    elif os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            problem = "running as root, and there is no 'postgres' user to own a cluster"
        if shutil.which("runuser") is None:
            problem = "running as root without runuser"
    if problem is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{problem} (CI=true: the outage test must run)", pytrace=False)
        pytest.skip(problem)
    server = PrivatePostgres(**options)
    try:
        server.start()
    except BaseException:
        server.remove()
        raise
    return server


@pytest.fixture
def private_cluster() -> Iterator[PrivatePostgres]:
    """A started private cluster for one test, removed after it (a conftest plugin's fixture)."""
    server = private_postgres_or_skip()
    try:
        yield server
    finally:
        server.remove()
