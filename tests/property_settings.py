"""How many examples each property test tries: a fixed, CI-sized count, scaled up to explore.

    @settings(max_examples=examples(60), suppress_health_check=list(HealthCheck))

Under the default "ci" profile (tests/conftest.py) the examples are derandomized, so CI sees the same
ones on every run. `HYPOTHESIS_PROFILE=explore` multiplies each count by `HYPOTHESIS_SCALE`
(default 40: ~2,000 examples for a test that runs 50 in CI) and draws new examples each time.
"""

from __future__ import annotations

import os


def examples(ci_count: int) -> int:
    """`ci_count` in CI; `ci_count` x HYPOTHESIS_SCALE when exploring."""
    if os.environ.get("HYPOTHESIS_PROFILE") != "explore":
        return ci_count
    return ci_count * int(os.environ.get("HYPOTHESIS_SCALE", "40"))
