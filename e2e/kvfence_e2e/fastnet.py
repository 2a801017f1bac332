"""In-process network operations for the decode's fence teardown (hosts.DecodeNet):
no process started on the teardown's path.

* Nft: nftables commands through libnftables (ctypes on libnftables.so.1, Debian package
  libnftables1: the library the `nft` command itself is built on, so the same command
  text means the same thing), run by this process in its own network namespace: the
  namespace a child `nft` would inherit (e2e/run starts the decode inside its host's
  namespace). Falls back to starting `nft` where the library cannot be loaded.
* tcp_sockets / destroy: the namespace's TCP sockets on given local ports over
  NETLINK_SOCK_DIAG (SOCK_DIAG_BY_FAMILY dumps, inet_diag_req_v2, filtered by the kernel
  on the local port) and SOCK_DESTROY of each one (what `ss -K` does, built with
  socket/struct). The receive queue reported (idiag_rqueue) is the kernel's
  rcv_nxt - copied_seq, the same figure as /proc/net/tcp's rx_queue. Falls back to the
  /proc/net/tcp{,6} scan and `ss -K` where netlink sock_diag (or its SOCK_DESTROY:
  CONFIG_INET_DIAG_DESTROY) is not available.
"""
from __future__ import annotations

import ctypes
import errno
import os
import socket
import struct
import subprocess
import threading

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
SOCK_DESTROY = 21
TCPDIAG_GETSOCK = 18  # (the compat request: struct inet_diag_req, both families)
NLM_F_REQUEST, NLM_F_ACK, NLM_F_DUMP = 0x1, 0x4, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
TCP_LISTEN = 10
# every TCP state but LISTEN (TCP_SYN_RECV also selects the request sockets): what the
# /proc scan's "state != 0A" keeps, and what `ss -K state connected` kills
STATES_NOT_LISTEN = 0xFFFF & ~(1 << TCP_LISTEN)
_NLH = struct.Struct("=IHHII")        # nlmsghdr
_REQ = struct.Struct("=BBBBI")        # inet_diag_req_v2 head (then inet_diag_sockid)
_SOCKID = struct.Struct("!HH16s16s")  # sport, dport (network order), src, dst
_TAIL = struct.Struct("=I8s")         # idiag_if, idiag_cookie
_REQ1 = struct.Struct("=BBBB")       # inet_diag_req head: family, src_len, dst_len, ext
_REQ1T = struct.Struct("=II")         # inet_diag_req tail: idiag_states, idiag_dbs
_MSG = struct.Struct("=BBBB")         # inet_diag_msg head (then the sockid)
_MSGQ = struct.Struct("=IIIII")       # expires, rqueue, wqueue, uid, inode
_V4MAPPED = b"\0" * 10 + b"\xff\xff"


class Nft:
    """nftables commands, in process (libnftables) or, as a fallback, by `nft -f -`.
    self.how says which: "libnftables" or "nft subprocess" (and why)."""

    def __init__(self):
        self.lock = threading.Lock()  # one context, used by one thread at a time
        self.ctx = None
        self.how = "nft subprocess"
        if os.environ.get("KVFENCE_E2E_NO_INPROC"):  # (to measure the old path)
            self.how = "nft subprocess (KVFENCE_E2E_NO_INPROC)"
            return
        try:
            lib = ctypes.CDLL("libnftables.so.1")
            lib.nft_ctx_new.restype = ctypes.c_void_p
            lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
            lib.nft_ctx_free.argtypes = [ctypes.c_void_p]
            lib.nft_ctx_buffer_output.argtypes = [ctypes.c_void_p]
            lib.nft_ctx_buffer_error.argtypes = [ctypes.c_void_p]
            lib.nft_ctx_get_error_buffer.restype = ctypes.c_char_p
            lib.nft_ctx_get_error_buffer.argtypes = [ctypes.c_void_p]
            lib.nft_run_cmd_from_buffer.restype = ctypes.c_int
            lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
            # (its netlink socket is opened here, in this process's namespace: the
            # decode's; this process never changes namespace)
            ctx = lib.nft_ctx_new(0)  # NFT_CTX_DEFAULT
            if not ctx:
                raise OSError("nft_ctx_new failed")
            # (output and errors into buffers: nothing on our stdout/stderr)
            lib.nft_ctx_buffer_output(ctx)
            lib.nft_ctx_buffer_error(ctx)
        except (OSError, AttributeError) as e:
            self.how = "nft subprocess (libnftables not loadable: %s)" % e
            return
        self.lib, self.ctx, self.how = lib, ctx, "libnftables"

    def run(self, text, check=True):
        """Runs nft command text (one or more commands, as `nft -f -` reads them).
        Raises RuntimeError on failure if check; returns True on success."""
        if self.ctx is None:
            r = subprocess.run(["nft", "-f", "-"], input=text, capture_output=True, text=True)
            if check and r.returncode != 0:
                raise RuntimeError("nft: %s" % r.stderr.strip())
            return r.returncode == 0
        with self.lock:
            rc = self.lib.nft_run_cmd_from_buffer(self.ctx, text.encode())
            err = self.lib.nft_ctx_get_error_buffer(self.ctx) or b""  # (and resets it)
        if check and rc != 0:
            raise RuntimeError("nft (libnftables): %s" % err.decode(errors="replace").strip())
        return rc == 0

    def close(self):
        if self.ctx is not None:
            with self.lock:
                self.lib.nft_ctx_free(self.ctx)
                self.ctx = None


class SockDiag:
    """The namespace's TCP sockets over NETLINK_SOCK_DIAG, and SOCK_DESTROY."""

    def __init__(self):
        self.lock = threading.Lock()
        self.seq = 0
        self.s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG)
        self.s.bind((0, 0))
        # (a kernel that never answers: socket.timeout, an OSError: the teardown fails
        # unproven, never fences; the abort falls back to `ss -K`)
        self.s.settimeout(5.0)
        self.destroy_ok = True  # until the kernel says EOPNOTSUPP
        self.compat = True
        try:  # (the one-walk compat dump, if this kernel still answers it)
            self.sockets([1])
        except OSError:
            self.compat = False
            self.sockets([1])  # the per-family dumps must answer (else OSError: fallback)
        self.how = ("sock_diag (netlink; TCPDIAG_GETSOCK: one dump, both families)"
                    if self.compat else "sock_diag (netlink; one dump per family)")

    def _req(self, mtype, flags, family, states, sport=0, dport=0, src=b"\0" * 16,
             dst=b"\0" * 16, ifindex=0, cookie=b"\0" * 8):
        self.seq += 1
        body = (_REQ.pack(family, socket.IPPROTO_TCP, 0, 0, states)
                + _SOCKID.pack(sport, dport, src, dst) + _TAIL.pack(ifindex, cookie))
        return self.seq, _NLH.pack(_NLH.size + len(body), mtype, flags, self.seq, 0) + body

    def _recv(self, seq):
        """Yields (type, payload) of the replies to seq until DONE / the ACK or error."""
        while True:
            data = self.s.recv(1 << 16)
            off = 0
            while off + _NLH.size <= len(data):
                ln, mtype, _fl, mseq, _pid = _NLH.unpack_from(data, off)
                if ln < _NLH.size:
                    raise RuntimeError("sock_diag: bad netlink message")
                payload = data[off + _NLH.size:off + ln]
                off += (ln + 3) & ~3
                if mseq != seq:
                    continue
                yield mtype, payload
                if mtype in (NLMSG_DONE, NLMSG_ERROR):
                    return

    def sockets(self, lports):
        """Every non-listening TCP socket (both families) on one of lports: dicts as
        common.netns_tcp_sockets gives (laddr, lport, raddr, rport, state, rxq, txq;
        addresses dotted IPv4, v4-mapped IPv6 as IPv4, else None) plus the diag id."""
        lports = set(lports)
        # Each dump walks the whole established hash (shared by every namespace: 262144
        # buckets on the dev box, ~2 ms a walk) whatever its filter: so one walk for all
        # the ports rather than one per port (the kernel's own filter on id.idiag_sport
        # where there is a single port), and, where the kernel has it, one walk for
        # both families: the compat request TCPDIAG_GETSOCK (struct inet_diag_req),
        # which the kernel runs with sdiag_family AF_UNSPEC (inet_diag_dump_compat).
        # Else one SOCK_DIAG_BY_FAMILY (inet_diag_req_v2) dump per family.
        one = next(iter(lports)) if len(lports) == 1 else 0
        out = []
        with self.lock:
            if self.compat:
                reqs = [self._compat_req(one)]
            else:
                reqs = [self._req(SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, fam,
                                  STATES_NOT_LISTEN, sport=one)
                        for fam in (socket.AF_INET, socket.AF_INET6)]
            for seq, msg in reqs:
                self.s.send(msg)
                for mtype, pl in self._recv(seq):
                    if mtype == NLMSG_ERROR:
                        e = -struct.unpack_from("=i", pl)[0]
                        if e:
                            raise OSError(e, "sock_diag dump: %s" % os.strerror(e))
                        continue
                    if mtype not in (SOCK_DIAG_BY_FAMILY, TCPDIAG_GETSOCK):
                        continue
                    f, st, _t, _r = _MSG.unpack_from(pl, 0)
                    sport, dport, src, dst = _SOCKID.unpack_from(pl, _MSG.size)
                    if sport not in lports:
                        continue
                    ifx, cookie = _TAIL.unpack_from(pl, _MSG.size + _SOCKID.size)
                    _e, rq, wq, _u, _i = _MSGQ.unpack_from(pl, _MSG.size + 48)
                    out.append({"laddr": _ip(f, src), "lport": sport, "raddr": _ip(f, dst),
                                "rport": dport, "state": "%02X" % st, "rxq": rq, "txq": wq,
                                "_id": (f, sport, dport, src, dst, ifx, cookie)})
        return out

    def _compat_req(self, sport):
        self.seq += 1
        body = (_REQ1.pack(socket.AF_INET, 0, 0, 0) + _SOCKID.pack(sport, 0, b"\0" * 16,
                                                                  b"\0" * 16)
                + _TAIL.pack(0, b"\0" * 8) + _REQ1T.pack(STATES_NOT_LISTEN, 0))
        return self.seq, _NLH.pack(_NLH.size + len(body), TCPDIAG_GETSOCK,
                                   NLM_F_REQUEST | NLM_F_DUMP, self.seq, 0) + body

    def destroy(self, s):
        """SOCK_DESTROY of one socket (a dict from sockets()): 0, or the errno (ENOENT:
        gone meanwhile). Raises OSError(EOPNOTSUPP) where the kernel has no destroy."""
        f, sport, dport, src, dst, ifx, cookie = s["_id"]
        with self.lock:
            seq, msg = self._req(SOCK_DESTROY, NLM_F_REQUEST | NLM_F_ACK, f, STATES_NOT_LISTEN,
                                 sport, dport, src, dst, ifx, cookie)
            self.s.send(msg)
            for mtype, pl in self._recv(seq):
                if mtype == NLMSG_ERROR:
                    e = -struct.unpack_from("=i", pl)[0]
                    if e in (errno.EOPNOTSUPP, errno.EPERM, errno.EACCES):
                        self.destroy_ok = False
                        raise OSError(e, "SOCK_DESTROY: %s" % os.strerror(e))
                    return e
        return 0


def _ip(fam, raw):
    if fam == socket.AF_INET:
        return socket.inet_ntoa(raw[:4])
    return socket.inet_ntoa(raw[12:]) if raw[:12] == _V4MAPPED else None
