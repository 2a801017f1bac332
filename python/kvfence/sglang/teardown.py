"""When is a prefill's transport to this decode torn down? (Mooncake over TCP.)

kvfence may fence a writer rank only once no byte of it can still land (DESIGN: a fence is
a proof, not a timeout). SGLang's heartbeat declaring a prefill dead proves nothing: a
prefill whose ``/health`` stalls may still be writing. With Mooncake's TCP transport the
prefill *pushes*: it opens TCP connections to this decode's Mooncake TCP listener (and to
its ZMQ port), and Mooncake's server threads copy what arrives on them into the
registered KV memory. So a write from that prefill can land only through a socket of
*this* process that was accepted from the prefill's address and is still open (data
already in its receive buffer is still copied after the peer closed, until Mooncake
closes its end). :func:`mooncake_tcp_torn_down` therefore proves the teardown by two
kernel facts, checked together:

1. **no inbound socket from the peer is left**: no TCP socket owned by this process whose
   local port is one of this process's listening ports and whose remote address is any
   address a writer of the instance connects from (its bootstrap host and every
   ``rank_ip`` its ranks registered: with multi-node prefill, or a data NIC, those differ),
   in any state but ``LISTEN`` / ``TIME_WAIT`` (``/proc/self/net/tcp{,6}`` matched with
   the ``socket:[inode]`` links of ``/proc/self/fd``; ``CLOSE_WAIT`` with unread bytes
   counts: Mooncake may still copy them);
2. **the peer cannot open a new one**: every endpoint the prefill served (its bootstrap
   server and each rank's ZMQ port) refuses a TCP connection (``ECONNREFUSED``: nothing
   listens there, i.e. the process is gone). A timeout or an unreachable host is *not* a
   proof.

Consequences, by design: a ``kill -9``-ed prefill on a reachable host is proven torn down
within a few polls (the kernel closes its sockets); a live prefill whose heartbeat failed
is never fenced (its sockets stay): its rooms are released by its own ACKs, or by the
quarantine policy; a powered-off host cannot be proven from here (fact 2 times out): an
operator or a fencing agent that has cut it off calls :func:`kvfence.sglang.fence_prefill`.
Several prefill processes on one host share its address, so fact 1 waits for all of them
(conservative: never an early fence), with one exception that is proven, not assumed: an
inbound socket whose other end is a socket of this host (the same network namespace: its
row is in the same kernel table) owned by a process that listens on a rank endpoint of
another, live prefill instance (``others``: their ZMQ rank ports, from SGLang's
connection pool) is that instance's, not the dead one's (a process serves one instance),
and does not count. Without that, a second prefill on the host of a ``kill -9``-ed one
kept its pages held for good (issue 41's ``prefill_killed`` on a real pair). A socket
whose other end has no owner (an orphan the kernel is closing), or is not on this host,
or whose owner cannot be read (``/proc/PID/fd`` of another user) still counts. Limit: a writer whose connections leave from an
address its rank did not register as ``rank_ip`` (a source address the kernel picks on
another NIC) is not seen; deploy with ``rank_ip`` (``SGLANG_HOST_IP``) set to the address
Mooncake's traffic leaves from, or fence such a prefill with ``fence_prefill``.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
from typing import Dict, Iterable, List, Set, Tuple, Union

__all__ = ["mooncake_tcp_torn_down", "not_torn_down", "inbound_sockets_from", "endpoint_refuses"]

_LISTEN = "0A"
_TIME_WAIT = "06"


def _own_socket_inodes() -> Set[str]:
    inodes: Set[str] = set()
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return inodes
    for fd in fds:
        try:
            target = os.readlink("/proc/self/fd/" + fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def _parse_addr(hexaddr: str) -> Tuple[str, int]:
    ip_hex, port_hex = hexaddr.split(":")
    raw = bytes.fromhex(ip_hex)
    if len(raw) == 4:
        ip = ipaddress.IPv4Address(raw[::-1])
        text = str(ip)
    else:
        # /proc stores IPv6 as four host-order 32-bit words.
        words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
        ip6 = ipaddress.IPv6Address(words)
        text = str(ip6.ipv4_mapped) if ip6.ipv4_mapped is not None else str(ip6)
    return text, int(port_hex, 16)


def _sockets() -> List[Tuple[str, int, str, int, str, str]]:
    rows = []
    for path in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            with open(path) as f:
                lines = f.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) < 10:
                continue
            lip, lport = _parse_addr(parts[1])
            rip, rport = _parse_addr(parts[2])
            rows.append((lip, lport, rip, rport, parts[3], parts[9]))
    return rows


def _resolve(host: str) -> Set[str]:
    try:
        return {str(ai[4][0]) for ai in socket.getaddrinfo(host, None)}
    except OSError:
        return {host}


def _socket_owners(inodes: Set[str]) -> Dict[str, Set[int]]:
    """The processes holding each socket inode of ``inodes`` (a scan of every readable
    ``/proc/PID/fd``; a process whose descriptors cannot be read is not seen)."""
    owners: Dict[str, Set[int]] = {}
    if not inodes:
        return owners
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return owners
    for pid in pids:
        try:
            fds = os.listdir("/proc/%d/fd" % pid)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink("/proc/%d/fd/%s" % (pid, fd))
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                owners.setdefault(target[8:-1], set()).add(pid)
    return owners


_ANY = {"0.0.0.0", "::"}


def _others_sockets(rows: List[Tuple[str, int, str, int, str, str]],
                    others: Iterable[Tuple[str, int]]) -> Set[Tuple[str, int, str, int]]:
    """The connections ``(local ip, local port, remote ip, remote port)`` of this host's
    sockets held by a process that listens on one of ``others`` (rank endpoints of live
    prefill instances)."""
    want: Set[Tuple[str, int]] = set()
    for h, p in others:
        for ip in _resolve(h):
            want.add((ip, int(p)))
    ports = {p for _, p in want}
    listen = {ino for (lip, lport, _, _, st, ino) in rows
              if st == _LISTEN and ino != "0" and lport in ports
              and ((lip, lport) in want or lip in _ANY)}
    if not listen:
        return set()
    conn = {ino for (_, _, _, _, st, ino) in rows if st != _LISTEN and ino != "0"}
    owners = _socket_owners(listen | conn)
    serving = set().union(*(owners.get(i, set()) for i in listen))
    return {(lip, lport, rip, rport) for (lip, lport, rip, rport, st, ino) in rows
            if st != _LISTEN and ino != "0" and owners.get(ino, set()) & serving}


def inbound_sockets_from(host: Union[str, Iterable[str]],
                         others: Iterable[Tuple[str, int]] = ()) -> int:
    """How many sockets of this process, accepted on one of its listening ports from
    ``host`` (one address or name, or several), are still open (any state but LISTEN /
    TIME_WAIT), less those whose other end is a socket of this host held by a process
    that listens on one of ``others`` (rank endpoints of other, live prefill instances:
    see the module docstring)."""
    return len(_inbound(host, others))


#: ``/proc/net/tcp``'s state codes, for messages.
_STATES = {"01": "ESTABLISHED", "02": "SYN_SENT", "03": "SYN_RECV", "04": "FIN_WAIT1",
           "05": "FIN_WAIT2", "06": "TIME_WAIT", "07": "CLOSE", "08": "CLOSE_WAIT",
           "09": "LAST_ACK", "0A": "LISTEN", "0B": "CLOSING"}


def _inbound(host: Union[str, Iterable[str]],
             others: Iterable[Tuple[str, int]] = ()) -> List[Tuple[str, int, str, int, str]]:
    """:func:`inbound_sockets_from`'s sockets: (local ip, local port, remote ip, remote
    port, state code)."""
    mine = _own_socket_inodes()
    rows = _sockets()
    listening = {lport for (_, lport, _, _, st, ino) in rows if st == _LISTEN and ino in mine}
    # Both ends of a connection this process made to itself (its gloo group, say) are
    # ours: not the peer's.
    own_ends = {(lip, lport) for (lip, lport, _, _, st, ino) in rows
                if ino in mine and st != _LISTEN}
    peers: Set[str] = set()
    for h in ([host] if isinstance(host, str) else host):
        peers |= _resolve(h)
    inbound = [(lip, lport, rip, rport, st) for (lip, lport, rip, rport, st, ino) in rows
               if ino in mine and st not in (_LISTEN, _TIME_WAIT) and lport in listening
               and rip in peers and (rip, rport) not in own_ends]
    others = list(others)
    if inbound and others:
        # the other end of our (lip, lport) <- (rip, rport) is their (rip, rport) -> (lip, lport)
        theirs = _others_sockets(rows, others)
        inbound = [c for c in inbound if (c[2], c[3], c[0], c[1]) not in theirs]
    return inbound


def endpoint_refuses(host: str, port: int, timeout: float = 0.5) -> bool:
    """True only if a TCP connect to ``host:port`` is refused (nothing listens there)."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return False
    except ConnectionRefusedError:
        return True
    except OSError as e:
        return e.errno == errno.ECONNREFUSED


def not_torn_down(hosts: Union[str, Iterable[str]],
                  endpoints: Iterable[Tuple[str, int]],
                  others: Iterable[Tuple[str, int]] = ()) -> str:
    """Why :func:`mooncake_tcp_torn_down` does not hold now, for an operator's log (the
    endpoints that still accept, the sockets still open); ``""`` if it holds."""
    eps = list(endpoints)
    if not eps:
        return "no endpoint of the instance is known"
    open_eps = ["%s:%d" % (h, p) for h, p in eps if not endpoint_refuses(h, p)]
    if open_eps:
        return "its endpoints still accept connections: %s" % ", ".join(open_eps)
    peers = {hosts} if isinstance(hosts, str) else set(hosts)
    peers.update(h for h, _ in eps)
    mine = set(eps)
    left = _inbound(sorted(peers), [e for e in others if e not in mine])
    if left:
        return "sockets from %s still open: %s" % (", ".join(sorted(peers)), ", ".join(
            "%s:%d <- %s:%d %s" % (lip, lport, rip, rport, _STATES.get(st, st))
            for lip, lport, rip, rport, st in left[:8]) + (" (+%d)" % (len(left) - 8) if len(left) > 8 else ""))
    return ""


def mooncake_tcp_torn_down(hosts: Union[str, Iterable[str]],
                           endpoints: Iterable[Tuple[str, int]],
                           others: Iterable[Tuple[str, int]] = ()) -> bool:
    """The proof described in the module docstring, for the prefill instance whose
    writers connect from ``hosts`` (its bootstrap host and every ``rank_ip`` its ranks
    registered: a multi-node prefill's ranks, or a data NIC, connect from addresses other
    than the bootstrap host) and that served ``endpoints`` (its bootstrap server and
    each rank's ZMQ endpoint). Every endpoint's host counts as a writer's host too.
    ``others``: the rank endpoints of the other, live prefill instances this decode
    knows (their sockets on a shared host do not count; none of ``endpoints`` is one)."""
    eps = list(endpoints)
    if not eps:
        return False
    if not all(endpoint_refuses(h, p) for h, p in eps):
        return False
    peers = {hosts} if isinstance(hosts, str) else set(hosts)
    peers.update(h for h, _ in eps)
    mine = set(eps)
    return inbound_sockets_from(sorted(peers), [e for e in others if e not in mine]) == 0
