"""Does a killed peer's write stop when its control connection closes?  A measurement.

    e2e/run probe-kill [--tries N] [--mib M]   (python -m kvfence_e2e.probe_kill)

The target (this process) registers M MiB; a child process opens a control connection,
submits one M MiB Mooncake write into it and kill -9s itself D ms later. When the
target reads EOF on the control connection it records how many bytes have landed and
the state of its own TCP sockets, then watches for 1 s. Bytes that land after the EOF
are bytes a decode that fenced at EOF would let into a reused page.
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np

from .common import my_tcp_sockets


def child(sess, addr, port, mib, delay):
    from mooncake.engine import TransferEngine
    n = mib << 20
    t = TransferEngine()
    t.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "")
    src = np.full(n, 7, dtype=np.uint8)
    t.register_memory(src.ctypes.data, n)
    t.transfer_sync_write(sess, src.ctypes.data, addr, 16)
    c = socket.create_connection(("127.0.0.1", port))
    c.sendall(b"go")
    t.transfer_submit_write(sess, src.ctypes.data, addr, n)
    time.sleep(delay)
    os.kill(os.getpid(), signal.SIGKILL)


def main():
    ap = argparse.ArgumentParser(prog="probe_kill")
    ap.add_argument("--tries", type=int, default=5)
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        sess, addr, port, mib, delay = a.child
        return child(sess, int(addr), int(port), int(mib), float(delay))
    from .__main__ import quiet_native_logs
    quiet_native_logs()
    from mooncake.engine import TransferEngine
    n = a.mib << 20
    t = TransferEngine()
    t.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "")
    buf = np.zeros(n, dtype=np.uint8)
    t.register_memory(buf.ctypes.data, n)
    sess = "127.0.0.1:%d" % t.get_rpc_port()
    late_tries = 0
    for k in range(a.tries):
        buf[:] = 0
        ls = socket.socket()
        ls.bind(("127.0.0.1", 0))
        ls.listen(1)
        delay = 0.01 + 0.02 * (k % 3)
        p = subprocess.Popen([sys.executable, "-m", "kvfence_e2e.probe_kill", "--child", sess,
                              str(buf.ctypes.data), str(ls.getsockname()[1]), str(a.mib),
                              str(delay)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        c, _ = ls.accept()
        c.recv(2)
        c.recv(2)  # EOF: the child is dead
        mine = c.getsockname()[1]
        socks = [x for x in my_tcp_sockets() if x[2] == "08" and x[0] != mine]
        at_eof = int(np.count_nonzero(buf))
        c.close()
        ls.close()
        t0 = time.monotonic()
        last, t_last = at_eof, 0.0
        while time.monotonic() - t0 < 1.0:
            m = int(np.count_nonzero(buf))
            if m != last:
                last, t_last = m, (time.monotonic() - t0) * 1000
        p.wait()
        late = last - at_eof
        late_tries += late > 0
        print("try %d: kill %2.0f ms after submit; at control EOF %6.2f MiB landed; "
              "half-closed data sockets (port, peer, unread bytes) %s; after EOF +%.2f MiB (last at +%.0f ms)"
              % (k, delay * 1000, at_eof / 2**20, [(x[0], x[1], x[3]) for x in socks],
                 late / 2**20, t_last), flush=True)
    print("%d of %d tries: bytes of a dead peer landed after its control connection closed"
          % (late_tries, a.tries))


if __name__ == "__main__":
    main()
