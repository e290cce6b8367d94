"""What every rlmq process shares: the stop flag, signal handling, exit codes, logging, threads.

The first SIGTERM/SIGINT sets the stop flag: loops notice it at their next poll timeout and finish
warmly (flush, say goodbye, close sockets). The second exits at once. A stop the service set itself
(the coordinator's `stop` directive) is no signal: the first signal after it still stops warmly.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import resource
import signal
import sys
import threading
import time
from collections.abc import Iterator
from types import FrameType

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_TARGET_MISSED = 3
EXIT_WORLD_LOST = 75  # a learner rank whose torch.distributed world is gone: restarted, it joins a new one
EXIT_DISK = 74  # its disk refused a write (full, or not writable): restarting would not mend it (EX_IOERR)
EXIT_INTERRUPTED = 130


class StopFlag:
    """Set once, by a signal or by the service itself; `wait` doubles as an interruptible sleep."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason = ""

    def set(self, reason: str = "") -> None:
        if not self._event.is_set():
            self.reason = reason
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def __call__(self) -> bool:  # so a StopFlag can be passed where a `should_stop` is expected
        return self._event.is_set()

    def wait(self, seconds: float) -> bool:
        return self._event.wait(seconds)


def install_signal_handlers(stop: StopFlag, log: logging.Logger) -> None:
    """First SIGTERM/SIGINT: warm stop. Second: leave now.

    The signals are counted apart from the flag: `rlmq up` sends its SIGTERM after the coordinator's
    `stop` directive has set the flag, and a learner still writing its final checkpoint then must
    finish it, not die as on a second signal."""
    signalled = threading.Event()

    def handle(signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if signalled.is_set():
            log.warning("second %s: stopping at once", name)
            os._exit(EXIT_INTERRUPTED)
        signalled.set()
        log.info("%s: stopping warmly (again to stop at once)", name)
        stop.set(name)

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)


@contextlib.contextmanager
def signals_end_at_once() -> Iterator[None]:
    """While the main thread waits inside a C++ call that Python's signal handlers cannot run in
    (torch's rendezvous waits minutes for its peers), SIGTERM and SIGINT end the process at once:
    it holds nothing yet that a warm stop would save. Elsewhere than the main thread, a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, signal.SIG_DFL) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def configure_logging(name: str, level: str = "INFO") -> logging.Logger:
    logging.basicConfig(
        level=os.environ.get("RLMQ_LOG_LEVEL", level),
        format=f"%(asctime)s {name} %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    return logging.getLogger(name)


def limit_threads(torch_threads: int = 1) -> None:
    """One intra-op thread per process by default: on shared cores OpenMP pools fight, and each
    process slows the others down many times over (benchmarks/LOG.md §2).

    Must run before numpy/torch are imported to affect their pools; torch is also told directly.
    """
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, str(torch_threads))
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(torch_threads)


def open_files_as_allowed() -> int:
    """Raise this process's limit on open files to what the system allows it (the hard limit), and
    return it. Every connection takes a descriptor: a coordinator holds two per actor, a learner
    rank one, and a stock soft limit of 1,024 would refuse the fleet's 500th actor
    (docs/architecture.md, "Capacity")."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        return hard
    return soft


def cores_given(cgroup_cpu_max: str = "/sys/fs/cgroup/cpu.max") -> int:
    """The whole cores this process may use: those it may run on, fewer where the CPU quota of its
    container's cgroup (v2: a Kubernetes pod's CPU limit) allows fewer; at least 1."""
    cores = len(os.sched_getaffinity(0))
    try:
        with open(cgroup_cpu_max) as limits:
            quota, period = limits.read().split()
        if quota == "max":
            return cores
        return max(1, min(cores, int(quota) // int(period)))
    except (OSError, ValueError):  # no cgroup v2 quota file, or not one we can read
        return cores


def keep_freed_memory(mmap_threshold: int = 32 << 20, trim_threshold: int = 256 << 20) -> bool:
    """Have glibc's malloc serve blocks up to `mmap_threshold` bytes from its heap and keep up to
    `trim_threshold` bytes of freed memory instead of returning it to the kernel.

    A learner frees and reallocates the same few-hundred-KB tensors every step; above glibc's
    128 KB default each is a fresh mmap whose pages fault in again on every step (what keeping them
    saves a population's update: benchmarks/LOG.md §4). False where the C library
    is not glibc: nothing changes there.

    Blocks past 32 MB (the most glibc lets the threshold be) are still fresh mmaps: torch's CPU
    allocator is told to ask for transparent huge pages for them (`THP_MEM_ALLOC_ENABLE`, read at
    its first large allocation; the kernel's "madvise" mode), so that they fault in 2 MB at a time,
    not 4 KB (a population of Atari-sized members: benchmarks/LOG.md §10).
    """
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
    heap = libc.mallopt(m_mmap_threshold, mmap_threshold)
    return bool(heap and libc.mallopt(m_trim_threshold, trim_threshold))


def release_freed_memory() -> bool:
    """Return the memory glibc's malloc holds freed to the kernel, from every arena (`malloc_trim`):
    freed blocks in the arenas of other threads (ZeroMQ's I/O thread: the queues of a flood of
    subscribers) are otherwise kept for good. False where the C library is not glibc."""
    try:
        return bool(ctypes.CDLL("libc.so.6").malloc_trim(0))
    except (OSError, AttributeError):
        return False


def announce(path: str, **ports: int) -> None:
    """Write the ports this process bound to `path` (JSON, replaced atomically), for `rlmq up`,
    which follows them in its scrape targets; nothing when `path` is empty."""
    if path:
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(ports, f)
        os.replace(tmp, path)


class RejectLog:
    """Log lines for dropped messages: reason, size, sender and the error's detail cut to
    DETAIL_CHARS, never the message (a hostile one can hold megabytes), and at most one line per
    reason every `period_s`, which says how many more of that reason were dropped since."""

    DETAIL_CHARS = 160

    def __init__(self, log: logging.Logger, period_s: float = 10.0) -> None:
        self.log, self.period_s = log, period_s
        self.quiet_until: dict[str, float] = {}
        self.unlogged: dict[str, int] = {}

    def __call__(self, reason: str, detail: str, size: int | None = None, sender: bytes = b"") -> None:
        now = time.monotonic()
        if now < self.quiet_until.get(reason, 0.0):
            self.unlogged[reason] = self.unlogged.get(reason, 0) + 1
            return
        if len(self.quiet_until) > 1024:  # reasons come from a fixed set; bounded all the same
            self.quiet_until.clear()
        self.quiet_until[reason] = now + self.period_s
        more = self.unlogged.pop(reason, 0)
        self.log.warning(
            "dropped a message: %s%s%s: %s%s",
            reason,
            "" if size is None else f", {size} bytes",
            f" from {sender[:32].hex()}" if sender else "",
            detail[: self.DETAIL_CHARS],
            f" (and {more} more of this reason in the last {self.period_s:g} s)" if more else "",
        )


class RateTimer:
    """True at most once per `period` seconds: for heartbeats inside hot loops."""

    def __init__(self, period: float) -> None:
        self.period = period
        self._next = time.monotonic() + period

    def due(self) -> bool:
        now = time.monotonic()
        if now < self._next:
            return False
        self._next = now + self.period
        return True


def die_with_parent() -> None:
    """For `subprocess.Popen(preexec_fn=...)`: the child gets SIGKILL when its parent dies, so a
    supervisor killed outright leaves no orphans (Linux PR_SET_PDEATHSIG; a no-op elsewhere)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except OSError:
        pass
