"""Which address this host is reached at, and which network interface holds an address: what a
learner needs to tell actors and its peer ranks where it is without being told (issue 40).

A learner across hosts must give actors an endpoint they can reach, and torch.distributed (gloo,
NCCL) must listen on the interface its peers reach: gloo otherwise takes whatever the host name
resolves to (127.0.1.1 in a stock Debian /etc/hosts), and the world hangs in its first connect.
Both follow from one fact the learner has: the coordinator's address. The address this host's
routing table uses towards it is the one the other services (all of which reach the coordinator)
can reach this host at, and its interface is the one to listen on.
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct
from pathlib import Path
from urllib.parse import urlsplit

SIOCGIFADDR = 0x8915
AUTO = "auto"


def endpoint_host(endpoint: str) -> str:
    """ "tcp://10.0.0.7:5555" → "10.0.0.7"; "tcp://[fd00::1]:5555" → "fd00::1"; "" for ipc:// and
    inproc:// (no network host)."""
    parts = urlsplit(endpoint)
    return parts.hostname or "" if parts.scheme == "tcp" else ""


def source_address(host: str) -> str:
    """The local address this host's routes use to reach `host` (a UDP socket's connect sends
    nothing); "127.0.0.1" where `host` is this host's loopback or cannot be resolved."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((host, 9))
            return str(probe.getsockname()[0])
    except OSError:  # no route, or a name that does not resolve
        return "127.0.0.1"


def interface_of(address: str) -> str | None:
    """The name of the interface holding IPv4 `address`, or None (not an address of this host, an
    IPv6 one, or not Linux)."""
    try:
        wanted = ipaddress.IPv4Address(address)
    except ValueError:
        return None
    if wanted.is_loopback:
        return loopback_interface()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            try:
                answer = fcntl.ioctl(sock.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address on it
                continue
            if ipaddress.IPv4Address(answer[20:24]) == wanted:
                return name
    return None


def loopback_interface() -> str:
    """The loopback interface's name (Linux: the one flagged IFF_LOOPBACK; "lo" elsewhere)."""
    for flags in sorted(Path("/sys/class/net").glob("*/flags")):
        try:
            if int(flags.read_text(), 16) & 0x8:  # IFF_LOOPBACK
                return flags.parent.name
        except (OSError, ValueError):
            continue
    return "lo"


def is_loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # "*" or a host name
        return False
