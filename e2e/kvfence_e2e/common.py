"""Wire protocol (newline-delimited JSON over plain TCP) and the page format."""
from __future__ import annotations

import json
import socket
import threading
import zlib

import numpy as np

MAGIC_DATA = 0x4B564441  # "KVDA": a page written by a prefill rank
MAGIC_FREE = 0x4B564652  # "KVFR": stamped by the decode when it frees the page
MAGIC_OWNED = 0x4B564F57  # "KVOW": stamped at (re)allocation, before any write lands
HDR = 16  # bytes: magic u32, request u32, chunk u32, crc32 u32

RULES = ("naive", "timeout-30s", "timeout-50ms", "kvfence")


def payload(req: int, chunk: int, page_size: int) -> np.ndarray:
    """Deterministic KV bytes of (request, chunk) (uint32 words)."""
    n = (page_size - HDR) // 4
    base = (req * 2654435761 + chunk * 40503 + 0x9E3779B9) & 0xFFFFFFFF
    return np.arange(n, dtype=np.uint32) * np.uint32(2246822519) ^ np.uint32(base)


def fill_page(view: np.ndarray, req: int, chunk: int) -> None:
    """Writes a full page (header + payload) into a uint8 view of page_size bytes."""
    body = payload(req, chunk, view.size)
    raw = body.view(np.uint8)
    view[HDR:HDR + raw.size] = raw
    hdr = np.array([MAGIC_DATA, req, chunk, zlib.crc32(raw)], dtype=np.uint32)
    view[:HDR] = hdr.view(np.uint8)


def header(view: np.ndarray):
    h = view[:HDR].copy().view(np.uint32)
    return int(h[0]), int(h[1]), int(h[2]), int(h[3])


def stamp(view: np.ndarray, magic: int, req: int) -> None:
    view[:HDR] = np.array([magic, req, 0, 0], dtype=np.uint32).view(np.uint8)


def check_page(view: np.ndarray, req: int, chunk: int) -> str:
    """'' if the page holds exactly (req, chunk) with a valid checksum, else why not."""
    magic, r, c, crc = header(view)
    if magic != MAGIC_DATA:
        return "missing"
    if r != req:
        return "foreign:%d" % r  # bytes of a request that does not own the page
    n = ((view.size - HDR) // 4) * 4
    if c != chunk or zlib.crc32(view[HDR:HDR + n]) != crc:
        return "torn"
    return ""


class Conn:
    """A control connection: send() from any thread, recv() from one reader thread."""

    def __init__(self, sock: socket.socket):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self.rfile = sock.makefile("rb")
        self.lock = threading.Lock()
        self.closed = False

    def send(self, **msg) -> bool:
        data = (json.dumps(msg) + "\n").encode()
        with self.lock:
            if self.closed:
                return False
            try:
                self.sock.sendall(data)
                return True
            except OSError:
                self.closed = True
                return False

    def recv(self):
        """The next message, or None at EOF / error (the peer is gone)."""
        try:
            line = self.rfile.readline()
        except OSError:
            line = b""
        if not line:
            self.closed = True
            return None
        return json.loads(line)

    def close(self):
        self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def _proc_tcp_lines():
    """The socket lines of /proc/net/tcp and /proc/net/tcp6 (this network namespace's TCP
    sockets, both families; a file that cannot be read is skipped)."""
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        yield from lines


def my_tcp_sockets():
    """This process's TCP sockets: (local port, remote port, state, rx_queue bytes).
    state is /proc/net/tcp's hex code ('01' established, '08' CLOSE_WAIT, '0A' listen)."""
    import os
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink("/proc/self/fd/" + fd)
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    out = []
    for ln in _proc_tcp_lines():
        p = ln.split()
        if len(p) > 9 and p[9] in inodes:
            out.append((int(p[1].rsplit(":", 1)[1], 16), int(p[2].rsplit(":", 1)[1], 16),
                        p[3], int(p[4].split(":")[1], 16)))
    return out


def _addr(hexaddr):
    """/proc/net/tcp{,6} address field -> (dotted IPv4 or None, port). IPv6 entries are
    reported as IPv4 when they are v4-mapped (::ffff:a.b.c.d), else as None."""
    import socket as _s
    import struct
    h, port = hexaddr.rsplit(":", 1)
    if len(h) == 8:
        ip = _s.inet_ntoa(struct.pack("<I", int(h, 16)))
    else:
        words = [int(h[i:i + 8], 16) for i in range(0, 32, 8)]
        raw = b"".join(struct.pack("<I", w) for w in words)
        ip = _s.inet_ntoa(raw[12:]) if raw[:12] == b"\0" * 10 + b"\xff\xff" else None
    return ip, int(port, 16)


def netns_tcp_sockets(lports=None):
    """The TCP sockets of this network namespace (those on one of lports, if given):
    dicts with laddr, lport, raddr, rport, state (hex: '01' established, '08' CLOSE_WAIT,
    '0A' listen), rxq (bytes queued for the reader), txq."""
    out = []
    keys = None if lports is None else tuple(":%04X " % p for p in lports)
    for ln in _proc_tcp_lines():
        if keys is not None and not any(k in ln[:60] for k in keys):
            continue  # (cheap pre-filter on the local address field)
        p = ln.split()
        if len(p) < 5:
            continue
        la, lp = _addr(p[1])
        ra, rp = _addr(p[2])
        tx, rx = p[4].split(":")
        out.append({"laddr": la, "lport": lp, "raddr": ra, "rport": rp, "state": p[3],
                    "rxq": int(rx, 16), "txq": int(tx, 16)})
    return out


def listen_ports():
    """The ports this process listens on (TCP, both families)."""
    mine = {(x[0]) for x in my_tcp_sockets() if x[2] == "0A"}
    return mine


def netns_listen_ports():
    """The ports listened on in this network namespace (TCP, both families). Where this
    process is alone in its namespace (the decode host of e2e/run hosts) the same set as
    listen_ports(), without its scan of every fd of the process (which grows with every
    engine kept: tens of ms on the loaded dev box, measured as a reset's cost)."""
    out = set()
    for ln in _proc_tcp_lines():
        p = ln.split(None, 4)
        if len(p) > 3 and p[3] == "0A":
            out.add(int(p[1].rsplit(":", 1)[1], 16))
    return out
