"""The dashboard imports transformers before its request threads do (`app.server.import_before_threads`).

transformers 5's lazy top-level module fails a first import made by two threads at once: each gets "cannot
import name ... from 'transformers'". Gradio runs each event handler in a thread of its own, so two clicks at
once (Export and Push on the run page) failed that way in the split-dashboard Chromium test.
"""

from __future__ import annotations

import subprocess
import sys

from browser_helpers import REPO

RACE = """
import threading
{warm}
errors = []
def take(name):
    try:
        exec(f"from transformers import {{name}}")
    except ImportError as exc:
        errors.append(str(exc))
threads = [threading.Thread(target=take, args=(n,)) for n in ("AutoConfig", "AutoTokenizer") * 2]
[t.start() for t in threads]
[t.join() for t in threads]
print(errors)
"""


def _race(warm: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", RACE.format(warm=warm)], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def test_request_threads_import_from_transformers_at_once_after_the_dashboards_import() -> None:
    assert _race("from app.server import import_before_threads; import_before_threads()") == "[]"
