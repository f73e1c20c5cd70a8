from __future__ import annotations

from hypothesis import HealthCheck, settings

# CI has 2 cores shared with other jobs: no deadlines, and no complaints about slow data.
settings.register_profile("default", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("default")
