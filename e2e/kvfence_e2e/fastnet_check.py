"""Unit-level checks of the in-process teardown (fastnet + hosts.DecodeNet), without
Mooncake: run inside a scratch network namespace that has 10.213.0.1 and 10.213.0.10 on
lo (e2e/hosts/ci.sh makes one). Prints PASS/FAIL lines; exit 1 on a failed check.

  1. the sock_diag view equals the /proc/net/tcp{,6} view (same sockets, same receive
     queues, bytes queued in both families);
  2. a teardown with bytes still queued waits for the reader, then proves the sockets
     gone, and the reader sees the abort (ECONNABORTED);
  3. after it, the fence filter drops a new connection from the peer to those ports;
  4. the proof is able to fail: with the abort step disabled, the teardown refuses
     (sockets remain) instead of returning;
  5. which implementation ran (in process where the host has it).
"""
from __future__ import annotations

import errno
import socket
import sys
import threading
import time

from . import hosts
from .common import netns_tcp_sockets

PEER, HOST = "10.213.0.10", "10.213.0.1"
passed = failed = 0


def check(name, ok, detail=""):
    global passed, failed
    print(("PASS " if ok else "FAIL ") + name + (" (%s)" % detail if detail else ""), flush=True)
    if ok:
        passed += 1
    else:
        failed += 1


class FakeDecode:
    hosts = {"prefills": {0: {"ip": PEER}}}

    def __init__(self):
        self.m = {"fence_waits_with_unread_data": 0}


def pairs(n=2, payload=5000):
    """A v6 (v4-mapped peers, as Mooncake's data port) and a v4 listener, n connections
    from PEER to each, payload bytes queued unread on each server socket."""
    L6 = socket.socket(socket.AF_INET6)
    L6.bind(("::", 0))
    L6.listen()
    L4 = socket.socket()
    L4.bind((HOST, 0))
    L4.listen()
    cs, srv = [], []
    for L in (L6, L4):
        for _ in range(n):
            c = socket.socket()
            c.bind((PEER, 0))
            c.connect((HOST, L.getsockname()[1]))
            cs.append(c)
            srv.append(L.accept()[0])
    for c in cs:
        c.sendall(b"z" * payload)
    time.sleep(0.05)
    return {L6.getsockname()[1], L4.getsockname()[1]}, [L6, L4], cs, srv


def strip(xs):
    key = lambda x: (x["lport"], x["rport"], x["raddr"] or "")  # noqa: E731
    return sorted(({k: v for k, v in x.items() if k != "_id"} for x in xs), key=key)


def main():
    d = FakeDecode()
    net = hosts.DecodeNet(d)
    # 1
    ports, ls, cs, srv = pairs()
    if net.diag is not None:
        a = strip(net.diag.sockets(ports))
        b = strip(x for x in netns_tcp_sockets(ports) if x["lport"] in ports and x["state"] != "0A")
        check("sock_diag view == /proc/net/tcp{,6} view", a == b and len(a) == 4
              and all(x["rxq"] == 5000 for x in a), "%d sockets, rxq %s" % (
                  len(a), [x["rxq"] for x in a]))
    else:
        check("sock_diag view (not available here: /proc scan in use)", True)

    # 2
    def reader():
        time.sleep(0.1)
        for s in srv:
            s.recv(1 << 20)
    th = threading.Thread(target=reader)
    th.start()
    rec = {"ports": ports}
    ms = net.teardown(0, rec)
    th.join()
    errs = []
    for s in srv:
        try:
            s.recv(10)
            errs.append(None)
        except OSError as e:
            errs.append(e.errno)
    left = [x for x in net._sockets(ports) if x["raddr"] == PEER]
    check("teardown with bytes queued waits for the reader, then proves the sockets gone",
          rec.get("fenced") and d.m["fence_waits_with_unread_data"] == 1 and ms >= 100
          and not left and all(e == errno.ECONNABORTED for e in errs),
          "%.1f ms, waits %d, readers %s" % (ms, d.m["fence_waits_with_unread_data"], errs))
    # 3
    c = socket.socket()
    c.bind((PEER, 0))
    c.settimeout(0.3)
    try:
        c.connect((HOST, sorted(ports)[0]))
        blocked = False
    except (socket.timeout, OSError):
        blocked = True
    c.close()
    check("the fence filter drops a new connection from the fenced peer", blocked)
    for s in ls + cs + srv:
        s.close()
    # 4: mutation: no abort
    ports, ls, cs, srv = pairs(payload=0)
    real = net._abort
    net._abort = lambda ports, seen: None
    try:
        net.teardown(0, {"ports": ports})
        refused = ""
    except RuntimeError as e:
        refused = str(e)
    net._abort = real
    check("the proof is able to fail (abort disabled: the teardown refuses)",
          "remain after the abort" in refused, refused[:80])
    for s in ls + cs + srv:
        s.close()
    # 5
    impl = net.impl()
    check("implementation: %s" % impl, True)
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
