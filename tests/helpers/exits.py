"""How a rank helper (ddp_rank.py and its kin) ends its process."""

from __future__ import annotations

import os
import sys


def leave() -> None:
    """End the process once its results are saved, past the interpreter's teardown: gloo's
    threads, torn down there, abort a process now and then ("terminate called without an active
    exception", exit -6) after everything it was run for is done."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
