"""``python -m agent_flow.cli``: the same as the ``agent-flow`` command."""

from __future__ import annotations

import sys

from agent_flow.cli._main import main

sys.exit(main())
