"""Simulated hosts for tests and benchmarks across a network: each host a Linux network namespace
with one interface (`eth0`, its own 10.x.y.z address), all joined by a small userspace Ethernet
switch that can cut a host off, delay packets and drop some. The kernel here has no netem qdisc, so
delay and loss are the switch's; a cut host's packets are dropped both ways, as a pulled cable or a
dead top-of-rack switch would, with no reset sent to anyone. Needs root (namespaces, TAP devices).

    with Hosts(["hub", "learner-0", "actors-0"], workdir) as hosts:
        hosts.address("hub")                        # "10.241.7.1"
        hosts.start("hub", ["rlmq", "coordinator", ...], "coordinator.log")
        hosts.cut("actors-0"); ...; hosts.heal("actors-0")
        hosts.delay("learner-0", 0.005)             # added to every packet to or from the host
        hosts.delay_between("learner-0", "learner-1", 0.005)  # to packets between these two only

Imported as `hosts` (tests/conftest.py puts this folder on the path); `python hosts.py switch ...`
is the switch itself, run by `Hosts` as a process of its own so that forwarding never waits on the
test's Python.
"""

from __future__ import annotations

import fcntl
import heapq
import os
import random
import select
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

TUNSETIFF, IFF_TAP, IFF_NO_PI = 0x400454CA, 0x0002, 0x1000
MAX_PACKET = 65536
MAX_HELD = 100_000  # packets on their way at once (delays); beyond, dropped


def why_not() -> str | None:
    """Why simulated hosts cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces and TAP devices need root"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    if not os.path.exists("/dev/net/tun"):
        return "no /dev/net/tun"
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


class Hosts:
    def __init__(self, names: list[str], workdir: Path) -> None:
        self.names, self.workdir = list(names), workdir
        self.tag = f"{os.getpid() % 10_000}"
        subnet = 1 + os.getpid() % 250
        self.addresses = {name: f"10.241.{subnet}.{i + 1}" for i, name in enumerate(names)}
        self.processes: list[subprocess.Popen[Any]] = []
        self.switch: subprocess.Popen[str] | None = None

    def namespace(self, name: str) -> str:
        return f"rlmq{self.tag}-{self.names.index(name)}"

    def address(self, name: str) -> str:
        return self.addresses[name]

    def __enter__(self) -> Hosts:
        try:
            for name in self.names:
                _ip("netns", "add", self.namespace(name))
                _ip("-n", self.namespace(name), "link", "set", "lo", "up")
            ports = [f"{self.namespace(n)}={self.addresses[n]}/24" for n in self.names]
            self.switch = subprocess.Popen(
                [sys.executable, __file__, "switch", *ports], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
            )
            assert self.switch.stdout is not None
            if self.switch.stdout.readline().strip() != "ready":
                raise RuntimeError("the switch did not start")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.wait()
        if self.switch is not None:
            self.switch.kill()
            self.switch.wait()
        for name in self.names:
            subprocess.run(["ip", "netns", "del", self.namespace(name)], capture_output=True)

    def command(self, name: str, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.namespace(name), *argv]

    def start(self, name: str, argv: list[str], log: str, **popen: Any) -> subprocess.Popen[Any]:
        """`argv` started on host `name` in `workdir`, its output to `workdir/log` unless `popen`
        says where."""
        with open(self.workdir / log, "wb") as out:
            process = subprocess.Popen(
                self.command(name, argv), **{"stdout": out, "stderr": subprocess.STDOUT, "cwd": self.workdir, **popen}
            )
        self.processes.append(process)
        return process

    def _tell(self, *words: object) -> None:
        assert self.switch is not None and self.switch.stdin is not None and self.switch.stdout is not None
        self.switch.stdin.write(" ".join(map(str, words)) + "\n")
        self.switch.stdin.flush()
        if self.switch.stdout.readline().strip() != "ok":
            raise RuntimeError(f"the switch refused {words}")

    def cut(self, name: str) -> None:
        """Drop every packet to or from the host until `heal`."""
        self._tell("cut", self.namespace(name))

    def heal(self, name: str) -> None:
        self._tell("heal", self.namespace(name))

    def delay(self, name: str, seconds: float) -> None:
        """Hold every packet to or from the host this long (a packet between two delayed hosts waits
        for both: one-way delay between them is the sum)."""
        self._tell("delay", self.namespace(name), seconds)

    def delay_between(self, one: str, other: str, seconds: float) -> None:
        """Hold every packet between these two hosts this long (one way), on top of their own delays."""
        self._tell("link", self.namespace(one), self.namespace(other), seconds)

    def loss(self, name: str, probability: float) -> None:
        """Drop each packet to or from the host with this probability."""
        self._tell("loss", self.namespace(name), probability)


# --- the switch (its own process) ---------------------------------------------------------------


def _tap(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TAP | IFF_NO_PI))
    return fd


def switch(ports: list[str]) -> None:
    """Forward Ethernet packets among TAP devices, one per namespace (`NAMESPACE=ADDRESS/PREFIX`),
    learning which port each MAC is behind; obey `cut`, `heal`, `delay`, `loss` lines on stdin."""
    fds: dict[str, int] = {}
    for i, port in enumerate(ports):
        namespace, address = port.split("=")
        tap = f"rqtap{os.getpid() % 100_000}-{i}"
        fds[namespace] = _tap(tap)
        _ip("link", "set", tap, "netns", namespace)
        _ip("-n", namespace, "link", "set", tap, "name", "eth0")
        _ip("-n", namespace, "addr", "add", address, "dev", "eth0")
        _ip("-n", namespace, "link", "set", "eth0", "up")
    port_of = {fd: name for name, fd in fds.items()}
    cut: set[str] = set()
    delay = dict.fromkeys(fds, 0.0)
    loss = dict.fromkeys(fds, 0.0)
    link: dict[tuple[str, str], float] = {}  # (port, port) → added one-way delay, both orders
    behind: dict[bytes, str] = {}  # MAC → port
    held: list[tuple[float, int, str, bytes]] = []  # (due, order, port, packet)
    order = 0
    draw = random.Random(0)
    print("ready", flush=True)
    stdin = sys.stdin.fileno()
    while True:
        timeout = max(held[0][0] - time.monotonic(), 0.0) if held else None
        readable, _, _ = select.select([stdin, *port_of], [], [], timeout)
        for fd in readable:
            if fd == stdin:
                line = sys.stdin.readline()
                if not line:
                    return
                verb, name, *value = line.split()
                if verb == "cut":
                    cut.add(name)
                elif verb == "heal":
                    cut.discard(name)
                elif verb == "delay":
                    delay[name] = float(value[0])
                elif verb == "loss":
                    loss[name] = float(value[0])
                elif verb == "link":
                    link[name, value[0]] = link[value[0], name] = float(value[1])
                else:
                    print(f"unknown {verb}", flush=True)
                    continue
                print("ok", flush=True)
                continue
            packet = os.read(fd, MAX_PACKET)
            source = port_of[fd]
            behind[packet[6:12]] = source
            if source in cut:
                continue
            target = behind.get(packet[:6])
            for name in [target] if target is not None else fds:
                if name == source or name in cut or draw.random() < max(loss[source], loss[name]):
                    continue
                if len(held) >= MAX_HELD:  # a full queue drops, as a switch's would
                    continue
                order += 1
                wait = delay[source] + delay[name] + link.get((source, name), 0.0)
                heapq.heappush(held, (time.monotonic() + wait, order, name, packet))
        now = time.monotonic()
        while held and held[0][0] <= now:
            _, _, name, packet = heapq.heappop(held)
            if name not in cut:  # cut while the packet was on its way
                try:
                    os.write(fds[name], packet)
                except OSError:  # the interface went down with its namespace
                    pass


if __name__ == "__main__" and sys.argv[1:2] == ["switch"]:
    switch(sys.argv[2:])
