"""Durable workers on two simulated machines, one of which loses its network mid-run.

Each "machine" is a network namespace with its own host name (``unshare --uts``), joined to
this one by a veth pair: its worker reaches the private PostgreSQL cluster
(`tests/private_postgres.py`, listening on each link's address) over its own link only. While
runs execute on both, host A's link goes down (``ip link set ... down``); the cluster drops
its connections within seconds (TCP keepalives), so host B takes A for dead and resumes its
runs, which wait for their sessions' claims (A's holder is on another machine: its claim must
expire, or A must come back and finish). The link comes back after a while. Every run must
finish exactly once: the model's answer, one ``run_finished``, ids without gap or repeat,
nothing left ``active``, and the counting tool (not idempotent) never run twice for a call.

Needs root (namespaces, links), ``ip`` and ``unshare``; skipped elsewhere with the reason,
and required under ``CI=true``, where CI runs as root.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("psycopg", reason="the multi-host test needs the postgres extra")
pytest.importorskip("dbos", reason="the multi-host test needs the durable extra")

from agent_flow.durable import DurableClient, DurableConfig
from agent_flow.sessions import open_store
from tests.durable_helpers import ROOT, assert_each_ran_once, counts_of, until
from tests.private_postgres import PrivatePostgres, private_postgres_or_skip

CALLS = 5


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    probe = f"afprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"ip netns is not allowed here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@dataclass
class Host:
    """A simulated machine: a namespace, its link, its address on it and the database's."""

    name: str
    namespace: str
    link: str  # this namespace's end of the veth pair, seen from the test's namespace
    address: str  # the machine's
    gateway: str  # the database's address on this link

    def down(self) -> None:
        _ip("link", "set", self.link, "down")

    def up(self) -> None:
        _ip("link", "set", self.link, "up")


def _make_host(index: int) -> Host:
    tag = f"{os.getpid() % 100000}{index}"
    host = Host(
        name=f"host-{'ab'[index]}",
        namespace=f"af-host-{tag}",
        link=f"afv{tag}",
        address=f"10.231.{index + 1}.2",
        gateway=f"10.231.{index + 1}.1",
    )
    _ip("netns", "add", host.namespace)
    _ip("link", "add", host.link, "type", "veth", "peer", "name", f"{host.link}p")
    _ip("link", "set", f"{host.link}p", "netns", host.namespace)
    _ip("addr", "add", f"{host.gateway}/24", "dev", host.link)
    _ip("link", "set", host.link, "up")
    inside = ("netns", "exec", host.namespace, "ip")
    _ip(*inside, "addr", "add", f"{host.address}/24", "dev", f"{host.link}p")
    _ip(*inside, "link", "set", f"{host.link}p", "up")
    _ip(*inside, "link", "set", "lo", "up")
    return host


def _remove_host(host: Host) -> None:
    subprocess.run(["ip", "link", "del", host.link], capture_output=True)
    subprocess.run(["ip", "netns", "del", host.namespace], capture_output=True)


@pytest.fixture
def hosts() -> Iterator[tuple[Host, Host]]:
    problem = _why_not()
    if problem is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{problem} (CI=true: the multi-host test must run)", pytrace=False)
        pytest.skip(problem)
    made: list[Host] = []
    try:
        made.append(_make_host(0))
        made.append(_make_host(1))
        yield made[0], made[1]
    finally:
        for host in made:
            _remove_host(host)


@pytest.fixture
def cluster(hosts: tuple[Host, Host]) -> Iterator[PrivatePostgres]:
    server = private_postgres_or_skip(
        listen=("127.0.0.1", *(host.gateway for host in hosts)), trust=("10.231.0.0/16",)
    )
    try:
        yield server
    finally:
        server.remove()


def _start_worker(
    host: Host, cluster: PrivatePostgres, counts: Path, executor: str
) -> subprocess.Popen[bytes]:
    """`tests.durable_app` on `host`: its namespace, its host name, the database over its link."""
    store = cluster.url("sessions", host.gateway)
    system = cluster.url("dbos", host.gateway)
    command = (
        f"hostname {host.name} && exec {sys.executable} -m tests.durable_app "
        f"{store} {system} {counts} {executor}"
    )
    return subprocess.Popen(
        ["ip", "netns", "exec", host.namespace, "unshare", "--uts", "sh", "-c", command],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(ROOT), "DURABLE_APP_PAUSE": "0.3"},
    )


@pytest.mark.timeout(300)
async def test_runs_finish_once_when_a_hosts_link_goes_down_mid_run_and_comes_back(
    hosts: tuple[Host, Host], cluster: PrivatePostgres, tmp_path: Path
) -> None:
    host_a, host_b = hosts
    store_url = cluster.create_database("sessions")
    system_url = cluster.create_database("dbos")
    durable = DurableConfig(enabled=True, system_database_url=system_url, poll_seconds=0.1)
    workers: list[subprocess.Popen[bytes]] = []
    try:
        async with open_store(store_url) as store, DurableClient(durable, store) as client:
            workers.append(_start_worker(host_a, cluster, tmp_path, "worker-a"))
            workers.append(_start_worker(host_b, cluster, tmp_path, "worker-b"))
            runs = []
            for _ in range(8):
                info = await store.create(agent="durable")
                handle = await client.enqueue(info.id, f"count {CALLS}")
                runs.append((info.id, handle.run_id))
            await until(lambda: sum(1 for _, run in runs if counts_of(tmp_path, run)) >= 4, 120)
            holders = {(await store.info(sid)).lease_run for sid, _ in runs}
            assert holders - {None}, "no run in flight when the link went down"
            host_a.down()
            await asyncio.sleep(12)
            host_a.up()
            outcomes = {}
            for session_id, run_id in runs:
                handle = client.handle(run_id, session_id)
                outcomes[run_id] = await asyncio.wait_for(handle.outcome(), 180)
            assert all(worker.poll() is None for worker in workers)
            await assert_each_ran_once(store, tmp_path, runs, outcomes)
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
            worker.wait()
