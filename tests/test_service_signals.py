"""A service's signals (common/service.py), in a real process: the first SIGTERM stops it warmly,
the second at once, and a stop the service set itself is not counted as a signal."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from rlmq.common.service import EXIT_INTERRUPTED

# Sets the flag as the coordinator's directive does (or not), then works until told twice.
SERVICE = (
    "import logging, sys, time\n"
    "from rlmq.common.service import StopFlag, install_signal_handlers\n"
    "logging.basicConfig(stream=sys.stderr, level=logging.INFO, format='%(message)s')\n"
    "stop = StopFlag()\n"
    "install_signal_handlers(stop, logging.getLogger())\n"
    "if sys.argv[1] == 'directive':\n"
    "    stop.set('directive')\n"
    "print('working', flush=True)\n"
    "while True:\n"
    "    time.sleep(0.02)  # the final checkpoint's write, say\n"
)


@pytest.mark.parametrize("stopped_by", ["directive", "nothing"])
def test_the_first_signal_stops_warmly_and_the_second_at_once_whatever_set_the_flag_before(stopped_by: str) -> None:
    service = subprocess.Popen(
        [sys.executable, "-c", SERVICE, stopped_by], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    out, said = service.stdout, service.stderr
    assert out is not None and said is not None  # piped
    try:
        assert out.readline() == "working\n"
        service.send_signal(signal.SIGTERM)
        # Read before the second signal, so the two are never one pending signal.
        assert said.readline() == "SIGTERM: stopping warmly (again to stop at once)\n"
        time.sleep(0.2)
        assert service.poll() is None, "the first signal ended the service"
        service.send_signal(signal.SIGTERM)
        assert service.wait(5) == EXIT_INTERRUPTED
        assert said.read() == "second SIGTERM: stopping at once\n"
    finally:
        service.kill()
        service.communicate()
