"""Bytes held in flight on the network: a dead writer's KV that lands after it died.

Used by ``serve_sglang.prefill_killed``. A prefill killed ``-9`` mid-write still has its
bytes in the kernel: what its socket had sent but not seen acknowledged is retransmitted
by the kernel after the process is gone (the socket becomes an orphan), and lands at the
decode whenever the network lets it through. On a real network that is a congested or
lossy link (retransmission timeouts back off to tens of seconds); here a packet filter
plays the link: ``nftables`` drops the data packets a process group sends to the decode's
listening ports while the hold is up (small packets, the TCP handshake and pure ACKs, pass,
so a connection made during the hold is still established), and ``lift()`` lets the
kernel's next retransmission through.

Which packets: those of sockets created by a process of one cgroup (v2), the second
prefill's: ``Server`` starts it inside ``cgroup(name)`` so that its children (SGLang's
scheduler process, which owns Mooncake's sockets) inherit it, and an orphan socket keeps
the cgroup of the process that made it. Nothing of the first prefill or the decode is
matched.

Needs root, ``nft`` and a cgroup v2 hierarchy; :func:`unavailable` says why not, and the
scenario then runs without the race (and says so).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from typing import Callable, Dict, Iterable, List, Optional, Set, Tuple

TABLE = "kvfence_serve"
#: Data segments are larger than this (bytes, IP length); the handshake, pure ACKs and a
#: bare FIN are not.
DATA_OVER = 200

Conn = Tuple[str, int, str, int]  # local ip, local port, peer ip, peer port


def _cgroup2_root() -> Optional[str]:
    """Where the cgroup v2 hierarchy is mounted (unified or hybrid), or None."""
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) > 2 and parts[2] == "cgroup2":
                    return parts[1]
    except OSError:
        pass
    return None


def unavailable() -> Optional[str]:
    """None if a hold can be made here, else why not."""
    if os.geteuid() != 0:
        return "not root (nftables and cgroups need it)"
    if shutil.which("nft") is None:
        return "no nft (Debian: apt-get install nftables)"
    if _cgroup2_root() is None:
        return "no cgroup v2 hierarchy mounted"
    r = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True)
    if r.returncode != 0:
        return "nft cannot list tables: " + r.stderr.strip()[:120]
    return None


def cgroup(name: str) -> str:
    """The path (made if needed) of cgroup ``name`` under the v2 root; a process started
    with ``echo $$ > PATH/cgroup.procs`` before it execs runs in it."""
    root = _cgroup2_root()
    assert root is not None, "no cgroup v2 hierarchy"
    path = os.path.join(root, name)
    os.makedirs(path, exist_ok=True)
    return path


def _nft(*args: str, stdin: Optional[str] = None) -> None:
    r = subprocess.run(["nft", *args], input=stdin, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"nft {' '.join(args)}: {r.stderr.strip()}")


class Hold:
    """Drops the data packets that sockets of cgroup ``name`` send to ``ports`` (TCP,
    any address) until :meth:`lift`."""

    def __init__(self, name: str, ports: Iterable[int]) -> None:
        self.name = name
        self.ports = sorted(set(ports))
        assert self.ports, "no port to hold"
        self.lift()  # a table left by an interrupted run
        # nft names a cgroup by its path under /sys/fs/cgroup (where the v2 hierarchy is
        # mounted on a unified host; "unified/NAME" on a hybrid one); ``level 1``: NAME is
        # one level below the v2 root.
        root = _cgroup2_root()
        assert root is not None, "no cgroup v2 hierarchy"
        path = os.path.relpath(os.path.join(root, name), "/sys/fs/cgroup")
        _nft("-f", "-", stdin=(
            f"table inet {TABLE} {{\n"
            f"  chain out {{\n"
            f"    type filter hook output priority 0; policy accept;\n"
            f"    socket cgroupv2 level 1 \"{path}\" tcp dport {{ {', '.join(map(str, self.ports))} }}"
            f" ip length > {DATA_OVER} counter drop\n"
            f"  }}\n"
            f"}}\n"))
        self.up = True

    def dropped(self) -> int:
        """Packets dropped so far (the rule's counter)."""
        r = subprocess.run(["nft", "list", "table", "inet", TABLE], capture_output=True, text=True)
        for word, nxt in zip(r.stdout.split(), r.stdout.split()[1:]):
            if word == "packets" and nxt.isdigit():
                return int(nxt)
        return 0

    def lift(self) -> None:
        """Lets the held packets through (the kernel's next retransmission delivers them)."""
        subprocess.run(["nft", "delete", "table", "inet", TABLE], capture_output=True)
        self.up = False


def _addr(s: str) -> Tuple[str, int]:
    host, _, port = s.rpartition(":")
    return host.strip("[]"), 0 if port == "*" else int(port)


def tcp_rows(owners: bool = False) -> List[Tuple[str, int, int, Conn, str]]:
    """Every TCP socket of this host: (state, recv-q, send-q, connection, process
    column); ``owners`` adds ``ss -p``'s process column (slower)."""
    args = ["ss", "-tnH", "state", "all"] + (["-p"] if owners else [])
    out = subprocess.run(args, capture_output=True, text=True).stdout
    rows = []
    for line in out.splitlines():
        f = line.split()
        if len(f) < 5:
            continue
        try:
            (lip, lport), (rip, rport) = _addr(f[3]), _addr(f[4])
            rows.append((f[0], int(f[1]), int(f[2]), (lip, lport, rip, rport),
                         " ".join(f[5:])))
        except ValueError:
            continue
    return rows


def group_pids(pgid: int) -> Set[int]:
    """The processes of process group ``pgid``."""
    pids = set()
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                stat = f.read()
            # the fields after the command's closing parenthesis: state ppid pgrp ...
            if int(stat.rsplit(")", 1)[1].split()[2]) == pgid:
                pids.add(int(p))
        except (OSError, ValueError, IndexError):
            continue
    return pids


def listening_ports(pgid: int) -> Set[int]:
    """The TCP ports the processes of group ``pgid`` listen on."""
    pids = group_pids(pgid)
    ports = set()
    for state, _, _, conn, proc in tcp_rows(owners=True):
        if state == "LISTEN" and any(f"pid={p}," in proc for p in pids):
            ports.add(conn[1])
    return ports


def unsent(pgid: int, ports: Set[int]) -> Dict[Conn, int]:
    """The connections of group ``pgid`` to one of ``ports``, with bytes not yet
    acknowledged by the other end (send-q > 0)."""
    pids = group_pids(pgid)
    return {conn: sq for state, _, sq, conn, proc in tcp_rows(owners=True)
            if sq > 0 and conn[3] in ports and any(f"pid={p}," in proc for p in pids)}


def delivered(conns: Iterable[Conn]) -> bool:
    """Whether every byte sent on ``conns`` (the writer's side) has been acknowledged and
    read by the other end: no writer-side socket with send-q > 0 is left (an orphan
    the kernel closes may be gone already) and no reader-side socket has recv-q > 0."""
    conns = set(conns)
    back = {(c[2], c[3], c[0], c[1]) for c in conns}
    for _, rq, sq, conn, _ in tcp_rows():
        if (conn in conns and sq > 0) or (conn in back and rq > 0):
            return False
    return True


def sockets_of(conns: Iterable[Conn]) -> List[str]:
    """``ss``'s rows (state, queues, addresses, owner) of both ends of ``conns``."""
    conns = set(conns)
    both = conns | {(c[2], c[3], c[0], c[1]) for c in conns}
    return [f"{st} rq={rq} sq={sq} {c[0]}:{c[1]}->{c[2]}:{c[3]} {proc}".strip()
            for st, rq, sq, c, proc in tcp_rows(owners=True) if c in both]


def wait(pred: Callable[[], bool], timeout: float, every: float = 0.2) -> bool:
    """Polls ``pred()`` until it holds or ``timeout`` seconds passed."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        if pred():
            return True
        time.sleep(every)
    return bool(pred())
