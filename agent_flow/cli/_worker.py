"""``agent-flow worker``: execute durable runs from the DBOS queue (`agent_flow.durable`)."""

from __future__ import annotations

import argparse
import os

from agent_flow.cli._build import _load_config
from agent_flow.cli._exit import EXIT_OK, EXIT_USAGE, _Failure, _Streams
from agent_flow.cli._run import _OTLP_ENDPOINTS
from agent_flow.cli._sessions import _store


async def _worker_command(args: argparse.Namespace, streams: _Streams) -> int:
    try:
        from agent_flow.durable import DurableWorker, load_durable_config
    except ImportError as err:
        raise _Failure(
            EXIT_USAGE,
            f"agent-flow worker needs the durable extra ({err.name} is missing); install it "
            "with pip install 'agent-flow[durable]'",
        ) from None

    def warn(text: str) -> None:
        streams.stderr.write(f"agent-flow: warning: {text}\n")

    config = _load_config(args.config, warn)
    durable = load_durable_config(args.config)
    updates: dict[str, object] = {"enabled": True}
    if args.system_db is not None:
        updates["system_database_url"] = args.system_db
    if args.executor_id is not None:
        updates["executor_id"] = args.executor_id
    durable = durable.model_copy(update=updates)
    on_agent = None
    export = None
    if args.otel or any(os.environ.get(name) for name in _OTLP_ENDPOINTS):
        # As `serve`: each run's spans join the trace of the request that enqueued it.
        from agent_flow.telemetry import configure_otlp, instrument

        export, on_agent = configure_otlp(), instrument
    try:
        async with (
            _store(args) as store,
            DurableWorker(
                durable, store, config, concurrency=args.concurrency, on_agent=on_agent
            ) as worker,
        ):
            streams.stderr.write(
                f"agent-flow: worker {worker.executor_id} executing runs from queue "
                f"{durable.queue!r}\n"
            )
            await worker.serve_forever()
    finally:
        if export is not None:
            export.shutdown()  # flushes what is buffered
    return EXIT_OK
