"""The e2e on separate hosts: network namespaces, Mooncake TCP between them, real network
faults (partitions that heal, slow and lossy links, failed writes recovered).

    e2e/run hosts [--json] [--scenarios clean,lossy,partition,teardown] [--rules ...]

e2e/run makes the namespaces (e2e/hosts/net.sh: a switch, the decode host 10.213.0.1,
prefill hosts 10.213.0.10+i) and runs this module inside the decode's namespace; the
decode spawns each prefill process inside its own host's namespace (`ip netns exec`).

The fence recipe for Mooncake TCP (DecodeNet.teardown; docs/FENCING.md): every prefill
incarnation writes to its own Mooncake engine on the decode (its own ports). To tear
down an incarnation's transport without its help, the decode
  1. filters: an nftables set in the decode's namespace drops every packet between the
     peer's address and that engine's ports (both directions): no new byte can enter;
  2. drains: waits until every socket between them has an empty receive queue, seen
     twice 1 ms apart with the filter in place (Mooncake's server copies a write from
     the socket straight into the destination: what is queued would still land);
  3. aborts: SOCK_DESTROY (what `ss -K` does) closes those sockets (the server's pending
     read fails, its session ends; the peer's retransmits and reconnects hit the filter);
  4. proves: no socket between them remains (a sock_diag dump of the namespace).
All in process (fastnet: libnftables, NETLINK_SOCK_DIAG; no process started on the
teardown's path); `nft`, `ss -K` and a /proc/net/tcp{,6} scan are the fallbacks where
those cannot be loaded or the kernel refuses them (the JSON's teardown_impl says which ran).
Only then are the incarnation's ranks fenced. The filter stays for the run: the engine
(and its ports) is kept, never reused; a new incarnation gets a new engine.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

from . import fastnet
from .common import RULES, netns_tcp_sockets

SCENARIOS = ("clean", "lossy", "partition", "teardown")
NFT_TABLE = "kvfence"


def sh(*cmd, check=True):
    r = subprocess.run(list(cmd), capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError("%s: rc=%d %s" % (" ".join(cmd), r.returncode, r.stderr.strip()))
    return r


_NFT = None
_DIAG = None
_DIAG_WHY = ""  # why sock_diag is not used (the /proc fallback runs), if it is not


def _inproc():
    """The in-process nftables context and sock_diag socket of this process (made once,
    shared by its runs): (Nft, SockDiag or None). Both act in this process's network
    namespace, the decode host's: the one a child `nft` or `ss` inherits."""
    global _NFT, _DIAG, _DIAG_WHY
    if _NFT is None:
        _NFT = fastnet.Nft()
        try:
            if os.environ.get("KVFENCE_E2E_NO_INPROC"):
                raise OSError("KVFENCE_E2E_NO_INPROC")
            _DIAG = fastnet.SockDiag()  # (it checks that the kernel answers its dumps)
        except OSError as e:
            _DIAG, _DIAG_WHY = None, str(e)
    return _NFT, _DIAG


class DecodeNet:
    """The decode host's side of the network: the fence filter and the teardown."""

    def __init__(self, decode):
        self.d = decode
        self.parts = []  # per teardown: (filter, drain, abort+proof) ms
        self.locks = {}
        self.nft, self.diag = _inproc()
        self.nft.run("delete table inet %s" % NFT_TABLE, check=False)  # a previous rule's
        self.nft.run("""
table inet %s {
  set fenced { type ipv4_addr . inet_service; }
  chain fence_in { type filter hook input priority -10; policy accept;
    ip saddr . tcp dport @fenced drop; }
  chain fence_out { type filter hook output priority -10; policy accept;
    ip daddr . tcp sport @fenced drop; }
}
""" % NFT_TABLE)
        self.abort_how = {}  # teardowns by how their sockets were aborted

    def impl(self):
        """Which implementation the teardown steps ran on (for the JSON)."""
        return {"filter": self.nft.how,
                "sockets": (self.diag.how if self.diag is not None else
                            "/proc/net/tcp{,6} scan (sock_diag: %s)" % _DIAG_WHY),
                "abort": dict(self.abort_how)}

    def _sockets(self, ports):
        if self.diag is not None:
            return self.diag.sockets(ports)
        return netns_tcp_sockets(ports)

    def teardown(self, inst, rec):
        """Tears down inst's current transport without its help; returns the ms from the
        call ("declared dead") to the proof. Idempotent per incarnation (0.0 again)."""
        with self.locks.setdefault(inst, threading.Lock()):  # one teardown per host at a time
            return self._teardown(inst, rec)

    def _abort(self, ports, seen):
        """Aborts every non-listening socket on ports (any peer: these ports serve one
        incarnation alone): SOCK_DESTROY of each one the drain's last look saw (seen:
        with the filter in place no new one can be made; the proof looks again), in
        process; else `ss -K`."""
        if self.diag is not None and self.diag.destroy_ok:
            try:
                for s in seen:
                    self.diag.destroy(s)  # (ENOENT: gone meanwhile; the proof decides)
                how = "SOCK_DESTROY (netlink)"
                self.abort_how[how] = self.abort_how.get(how, 0) + 1
                return
            except OSError:  # (no CONFIG_INET_DIAG_DESTROY, no CAP_NET_ADMIN)
                pass
        # (by port only: the data port is an IPv6 socket whose peers are v4-mapped,
        # which an IPv4 "dst" would not match)
        expr = " or ".join("sport = :%d" % p for p in sorted(ports))
        sh("ss", "-K", "-tn", "state", "connected", "( %s )" % expr, check=False)
        how = "ss -K"
        self.abort_how[how] = self.abort_how.get(how, 0) + 1

    def _teardown(self, inst, rec):
        """rec: the engine record of the incarnation (Decode.engines)."""
        t0 = time.monotonic()
        if rec is None or rec.get("fenced"):
            return 0.0
        peer = self.d.hosts["prefills"][inst]["ip"]
        ports = sorted(rec["ports"])
        # 1. filter
        elems = ", ".join("%s . %d" % (peer, p) for p in ports)
        self.nft.run("add element inet %s fenced { %s }" % (NFT_TABLE, elems))
        t1 = time.monotonic()

        seen = []

        def mine():
            seen[:] = [s for s in self._sockets(rec["ports"])
                       if s["lport"] in rec["ports"] and s["state"] != "0A"]
            return [s for s in seen if s["raddr"] == peer]

        # 2. drain: what is already queued is still copied into our memory; wait for it
        zero = 0
        waited = False
        while zero < 2:
            if any(s["rxq"] for s in mine()):
                zero, waited = 0, True
            else:
                zero += 1
            if zero < 2:
                time.sleep(0.001)
            if time.monotonic() - t0 > 30:
                raise RuntimeError("teardown: receive queues to %s never drained" % peer)
        if waited:
            self.d.m["fence_waits_with_unread_data"] += 1
        t2 = time.monotonic()
        # 3. abort (never the listening sockets)
        self._abort(ports, seen)
        # 4. prove
        left = mine()
        if left:
            raise RuntimeError("teardown: sockets to %s remain after the abort: %s"
                               % (peer, [{k: v for k, v in x.items() if k != "_id"}
                                         for x in left]))
        rec["fenced"] = True
        t3 = time.monotonic()
        self.parts.append((round((t1 - t0) * 1000, 2), round((t2 - t1) * 1000, 2),
                           round((t3 - t2) * 1000, 2)))
        return (t3 - t0) * 1000.0

    # ---- faults (run from here, in the other namespaces by name) ----
    def link(self, inst, up):
        """Cuts (both directions) or heals inst's host at its switch port."""
        sh("ip", "netns", "exec", self.d.hosts["switch_ns"], "ip", "link", "set",
           "vp%d" % inst, "up" if up else "down")

    def degrade(self, inst, netem, tbf, loss_pct):
        """A slow, jittery, lossy link for inst's host, both directions (its eth0 and its
        switch port). tc netem where the kernel has it; else (CONFIG_NET_SCH_NETEM unset,
        as on the dev box) a token bucket (tbf: a slow link, queueing delay that varies
        with the load) and random loss in the host's own namespace (nft numgen).
        Returns what was applied."""
        h = self.d.hosts["prefills"][inst]
        devs = ((h["ns"], "eth0"), (self.d.hosts["switch_ns"], "vp%d" % inst))
        spec = "%s loss %g%%" % (netem, loss_pct)
        ok = all(sh("ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root",
                    "netem", *spec.split(), check=False).returncode == 0 for ns, dev in devs)
        if ok:
            return "netem " + spec
        for ns, dev in devs:
            sh("ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root", check=False)
            sh("ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root",
               "tbf", *tbf.split())
        per = int(round(loss_pct * 100))  # per 10000
        rules = """
table inet kvfh_loss {
  chain lin { type filter hook input priority 0; policy accept; numgen random mod 10000 < %d drop; }
  chain lout { type filter hook output priority 0; policy accept; numgen random mod 10000 < %d drop; }
}
""" % (per, per)
        r = subprocess.run(["ip", "netns", "exec", h["ns"], "nft", "-f", "-"], input=rules,
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError("nft (loss): %s" % r.stderr.strip())
        return "tbf %s + random loss %g%% each way (nft; no netem in this kernel)" % (tbf, loss_pct)

    def clear_netem(self, inst):
        h = self.d.hosts["prefills"][inst]
        for ns, dev in ((h["ns"], "eth0"), (self.d.hosts["switch_ns"], "vp%d" % inst)):
            sh("ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root", check=False)


class Partition:
    """At cut_at the busiest prefill host is cut off (its switch port down) for cut_s,
    then healed. Its requests' bytes are watched for after the heal (Decode.scan_landings);
    it is respawned once its old process has exited (it exits when it reads the decode's
    FIN, i.e. after the heal)."""

    def __init__(self, cut_at, cut_s):
        self.cut_at, self.cut_s = cut_at, cut_s
        self.victim = None
        self.healed = False
        self.t_cut = None
        self.inflight_at_cut = 0

    def __call__(self, d, t):
        if self.victim is None and t >= self.cut_at:
            busy = {}
            for r in d.recs.values():
                if r.state == "transfer":
                    busy[r.inst] = busy.get(r.inst, 0) + 1
            self.victim = max(busy, key=busy.get) if busy else 0
            self.inflight_at_cut = busy.get(self.victim, 0)
            d.hold_respawn.add(self.victim)
            d.net.link(self.victim, False)
            self.t_cut = t
            d.m["partitions"] = d.m.get("partitions", 0) + 1
            d.m["requests_in_transfer_at_cut"] = self.inflight_at_cut
        elif self.victim is not None and not self.healed and t >= self.cut_at + self.cut_s:
            d.net.link(self.victim, True)
            self.healed = True
            d.watch = (set(d.rids_by_inst.get(self.victim, ())), time.monotonic())
            d.hold_respawn.discard(self.victim)


class Lossy:
    """From the start: one prefill host's link slow, jittery and lossy (both ways)."""

    def __init__(self, inst, a):
        self.inst, self.a, self.applied = inst, a, None

    def __call__(self, d, t):
        if self.applied is None:
            self.applied = d.net.degrade(self.inst, self.a.netem, self.a.tbf, self.a.loss)
            d.m["link"] = "host %d: %s" % (self.inst, self.applied)


def parse(argv):
    ap = argparse.ArgumentParser(prog="e2e/run hosts", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--id", required=True, help=argparse.SUPPRESS)  # the namespaces' run id
    ap.add_argument("--scenarios", default=",".join(SCENARIOS),
                    help="comma list of %s (default: all)" % ",".join(SCENARIOS))
    ap.add_argument("--rules", default=None, help="comma list (default: per scenario)")
    ap.add_argument("--duration", type=float, default=10.0, help="seconds of load per run")
    ap.add_argument("--rounds", type=int, default=1,
                    help="clean/lossy: interleaved rounds per rule (medians reported)")
    ap.add_argument("--instances", type=int, default=3)
    ap.add_argument("--scale", type=float, default=0.05,
                    help="deadlines scale: SGLang's 30 s ACK wait and 10 s heartbeat death "
                         "become 30*scale and 10*scale s (default 0.05: 1.5 s, 0.5 s). "
                         "clean/lossy (no partition) declare a host dead after 3 s at the "
                         "least: a shorter deadline declares busy hosts dead on a loaded box")
    ap.add_argument("--cut-at", type=float, default=None, help="partition: second of the cut "
                    "(default duration*0.3)")
    ap.add_argument("--cut-s", type=float, default=None,
                    help="partition: seconds cut (default: 30*scale + 1, past both deadlines)")
    ap.add_argument("--netem", default="delay 10ms 5ms",
                    help="lossy: tc netem delay/jitter on one prefill host's link")
    ap.add_argument("--tbf", default="rate 100mbit burst 64kb latency 30ms",
                    help="lossy, where the kernel has no netem: tc tbf arguments instead")
    ap.add_argument("--loss", type=float, default=1.0, help="lossy: %% of packets lost each way")
    ap.add_argument("--fail-share", type=float, default=0.003,
                    help="clean/lossy: share of requests whose last write returns -1")
    ap.add_argument("--teardown-fail-share", type=float, default=0.05,
                    help="teardown: share of -1 writes (each one resets a transport)")
    ap.add_argument("--reset-drain-s", type=float, default=0.5,
                    help="kvfence, -1 recovered: how long the old transport generation may "
                         "go on serving its requests in transfer after a reset before they "
                         "are aborted and it is torn down (0: at once, an abortive reset; "
                         "the wait never releases a page: only the fence after the proven "
                         "teardown does)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--teardown-report", default=None, metavar="PREFIX",
                    help="also write the teardown distribution to PREFIX.md and PREFIX.json")
    a = ap.parse_args(argv)
    a.scenarios = [x.strip() for x in a.scenarios.split(",") if x.strip()]
    bad = [x for x in a.scenarios if x not in SCENARIOS]
    if bad or not a.scenarios:
        ap.error("unknown scenario(s) %s; choose from %s" % (",".join(bad), ",".join(SCENARIOS)))
    if a.rules is not None:
        a.rules = [x.strip() for x in a.rules.split(",") if x.strip()]
        bad = [x for x in a.rules if x not in RULES]
        if bad or not a.rules:
            ap.error("unknown rule(s) %s; choose from %s" % (",".join(bad), ",".join(RULES)))
    if a.reset_drain_s < 0:
        ap.error("--reset-drain-s must be >= 0")
    if a.duration <= 0 or a.rounds < 1 or a.instances < 2 or a.scale <= 0:
        ap.error("--duration and --scale must be > 0, --rounds >= 1, --instances >= 2")
    if not 0 <= a.fail_share <= 1 or not 0 <= a.teardown_fail_share <= 1:
        ap.error("fail shares must be in [0, 1]")
    if a.cut_at is None:
        a.cut_at = a.duration * 0.3
    if a.cut_s is None:
        a.cut_s = 30 * a.scale + 1.0
    return a


def hosts_cfg(a):
    pre = "kvfh%s" % a.id
    return {"decode_ip": "10.213.0.1", "switch_ns": pre + "sw", "hb_ms": 1000.0 * a.scale,  # 10 a deadline
            "dead_after_s": 10.0 * a.scale, "linger_s": 2.0, "reset_drain_s": a.reset_drain_s,
            "prefills": [{"ns": "%sp%d" % (pre, i), "ip": "10.213.0.%d" % (10 + i)}
                         for i in range(a.instances)]}


def base_cfg(a, dead_after_s=None, **kw):
    c = dict(seed=a.seed, duration=a.duration, instances=a.instances, ranks_per_instance=2,
             pages=192, page_size=32768, pages_per_request=8, max_inflight=16,
             abort_share=0.3, abort_max_ms=20.0, slow_share=0.3, delay_ms=80.0,
             fail_share=a.fail_share, decode_ms=40.0, kill_at=a.duration * 0.4,
             scale=a.scale, hosts=hosts_cfg(a))
    if dead_after_s is not None:
        c["hosts"]["dead_after_s"] = dead_after_s
    c.update(kw)
    return SimpleNamespace(**c)


def pct(xs, q):
    xs = sorted(xs)
    if not xs:
        return None
    return round(xs[min(len(xs) - 1, int(q * len(xs)))], 2)


def dist(xs):
    if not xs:
        return {"n": 0}
    return {"n": len(xs), "min": round(min(xs), 2), "median": round(statistics.median(xs), 2),
            "p90": pct(xs, 0.9), "p99": pct(xs, 0.99), "max": round(max(xs), 2)}


def run_one(a, scenario, rule, rnd):
    from . import decode
    if scenario == "partition":
        # (more delayed writes: more of them queued and in flight at the cut)
        cfg = base_cfg(a, kill_at=None, fail_share=0.0, slow_share=0.5)
        tick = Partition(a.cut_at, a.cut_s)
    elif scenario == "lossy":
        cfg = base_cfg(a, dead_after_s=max(3.0, 10.0 * a.scale))
        tick = Lossy(1, a)
    elif scenario == "teardown":
        cfg = base_cfg(a, kill_at=None, fail_share=a.teardown_fail_share)
        tick = None
    else:
        cfg = base_cfg(a, dead_after_s=max(3.0, 10.0 * a.scale))
        tick = None
    cfg.seed = a.seed + rnd
    r = decode.run_mixed(cfg, rule, tick=tick)
    r["scenario"] = scenario
    r["round"] = rnd
    if isinstance(tick, Partition):
        r["cut_host"] = tick.victim
        r["cut_s"] = a.cut_s
    return r


DEFAULT_RULES = {"clean": ["timeout-30s", "kvfence"], "lossy": ["timeout-30s", "kvfence"],
                 "partition": list(RULES), "teardown": ["kvfence"]}

COLS = [("scenario", "scenario", 9), ("rule", "rule", 12), ("round", "rnd", 3),
        ("requests", "requests", 8), ("finished", "finished", 8),
        ("corrupted_requests", "corr.req", 8), ("corrupted_pages", "corr.pages", 10),
        ("fenced_host_landings_after_heal", "landed.heal", 11), ("failed_writes", "w=-1", 4),
        ("transport_resets", "resets", 6), ("declared_dead", "dead", 4),
        ("rank_fences", "fences", 6), ("pages_held_awaiting_drain_at_end", "held.end", 8),
        ("abort_to_release_ms_p50", "a2r.p50ms", 9), ("abort_to_release_ms_p99", "a2r.p99ms", 9),
        ("throughput_rps", "rps", 6), ("lost_pages", "lost", 4)]


def teardown_impl(results):
    """Which implementation each teardown step ran on, over the runs: filter and sockets
    as one run says (the same for every run of this process), abort counted."""
    impls = [r["teardown_impl"] for r in results if r.get("teardown_impl")]
    if not impls:
        return None
    abort = {}
    for x in impls:
        for k, v in x["abort"].items():
            abort[k] = abort.get(k, 0) + v
    return {"filter": impls[0]["filter"], "sockets": impls[0]["sockets"], "abort": abort}


def write_teardown_report(a, doc, results):
    parts = [p for r in results if r["rule"] == "kvfence" for p in r.get("teardown_parts_ms", ())]
    cols = list(zip(*parts)) if parts else [(), (), ()]
    causes = {sc: sum(1 for r in results if r["rule"] == "kvfence" and r["scenario"] == sc
                      for x in r.get("teardown_ms", ()) if x > 0) for sc in a.scenarios}
    cmd = "e2e/run hosts " + " ".join(sys.argv[1:][2:] if sys.argv[1:2] == ["--id"] else sys.argv[1:])
    try:
        load = open("/proc/loadavg").read().split()[:3]
    except OSError:
        load = []
    rep = {"command": cmd, "machine": doc["machine"] + " (the 2-core dev box, shared/loaded)",
           "loadavg_at_end": load, "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "teardown_ms": doc["teardown_ms"],
           "parts_ms": {"filter": dist(list(cols[0])), "drain": dist(list(cols[1])),
                        "abort_and_proof": dist(list(cols[2]))},
           "implementation": doc["teardown_impl"],
           "samples_by_scenario": causes, "samples_ms": doc["teardown_samples_ms"]}
    t = doc["teardown_ms"]
    lines = ["# Teardown of a Mooncake TCP transport, measured", "",
             "Time from \"declare the peer dead\" (a -1 write, a control EOF, a heartbeat "
             "deadline) to \"proven torn down\" (the decode's fence filter in place, every "
             "receive queue from the peer drained, its sockets aborted, none left), on the "
             "real engine (`DecodeNet.teardown` in `e2e/kvfence_e2e/hosts.py`, recipe in "
             "`docs/FENCING.md`). Written by the run below; raw samples in `TEARDOWN.json`.", "",
             "* command: `%s`" % cmd, "* machine: %s, load average at the end %s" % (
                 rep["machine"], " ".join(load)), "* date: %s" % rep["date_utc"], "",
             "| | n | min | median | p90 | p99 | max |", "|---|---|---|---|---|---|---|"]
    def row(name, d):
        if not d.get("n"):
            return "| %s | 0 | | | | | |" % name
        return "| %s | %d | %.1f | %.1f | %.1f | %.1f | %.1f |" % (
            name, d["n"], d["min"], d["median"], d["p90"], d["p99"], d["max"])
    lines.append(row("**teardown, ms**", t))
    for k, v in rep["parts_ms"].items():
        lines.append(row(k.replace("_", " ") + ", ms", v))
    waited = sum(r.get("fence_waits_with_unread_data", 0) for r in results if r["rule"] == "kvfence")
    rep["teardowns_that_found_bytes_queued"] = waited
    lines += ["", "Samples by scenario: %s." % ", ".join("%s %d" % kv for kv in causes.items()),
              "Teardowns that found bytes still queued from the peer (and waited for the "
              "server to apply them): %d." % waited,
              "", "Implementation: %s." % json.dumps(doc["teardown_impl"]),
              "", "Steps: *filter* = one `add element` to the fenced set (in process by "
              "libnftables, or one `nft` started: see implementation); *drain* = receive "
              "queues seen empty twice, 1 ms apart, with the filter in place (each look: "
              "a sock_diag dump per address family, or a scan of /proc/net/tcp{,6}); "
              "*abort and proof* = SOCK_DESTROY of each socket on the incarnation's ports "
              "(or one `ss -K` started) and one more look. The median is the figure the "
              "simulator can take as its default teardown (`MEASURED_TEARDOWN_MS`, "
              "started at detection and divided by `--time-scale` like the other peer "
              "times: `kvfence-sim --help`)."]
    with open(a.teardown_report + ".json", "w") as f:
        json.dump(rep, f, indent=1)
    with open(a.teardown_report + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")


def main(argv=None):
    a = parse(sys.argv[1:] if argv is None else argv)
    from .__main__ import quiet_native_logs, table
    quiet_native_logs()
    try:
        import mooncake.engine  # noqa: F401
    except Exception as e:  # pragma: no cover
        print("e2e hosts: Mooncake Transfer Engine unavailable: %s" % e, file=sys.stderr)
        return 77
    t0 = time.monotonic()
    results = []
    for sc in a.scenarios:
        rules = a.rules or DEFAULT_RULES[sc]
        rounds = a.rounds if sc in ("clean", "lossy") else 1
        for rnd in range(rounds):
            # interleaved: rule after rule within a round, the order rotated each round (a
            # rule that always ran first or last would carry the box's drift)
            for rule in rules[rnd % len(rules):] + rules[:rnd % len(rules)]:
                if not a.json:
                    print("running %s / %s (round %d)..." % (sc, rule, rnd), file=sys.stderr,
                          flush=True)
                results.append(run_one(a, sc, rule, rnd))
    teardowns = [x for r in results if r["rule"] == "kvfence" for x in r.get("teardown_ms", ())
                 if x > 0]
    summary = {}
    for sc in ("clean", "lossy"):
        for rule in RULES:
            xs = [r["throughput_rps"] for r in results if r["scenario"] == sc and r["rule"] == rule]
            if xs:
                summary.setdefault(sc, {})[rule] = {"throughput_rps_median": statistics.median(xs),
                                                    "rounds": len(xs)}
    if "clean" in summary and "kvfence" in summary["clean"] and "timeout-30s" in summary["clean"]:
        summary["kvfence_over_timeout30s_clean"] = round(
            summary["clean"]["kvfence"]["throughput_rps_median"]
            / summary["clean"]["timeout-30s"]["throughput_rps_median"], 3)
    if "lossy" in summary and "clean" in summary and "kvfence" in summary["lossy"]:
        summary["kvfence_lossy_over_clean"] = round(
            summary["lossy"]["kvfence"]["throughput_rps_median"]
            / summary["clean"]["kvfence"]["throughput_rps_median"], 3)
    bad = [r for r in results if r["rule"] == "kvfence" and (
        r["corrupted_requests"] or r["corrupted_pages"] or r["lost_pages"]
        or r.get("pages_unreleased_at_end") or r["fenced_host_landings_after_heal"])]
    wall = round(time.monotonic() - t0, 1)
    doc = {"mode": "hosts", "seed": a.seed, "wall_s": wall, "scale": a.scale,
           "machine": os.uname().nodename + ", %d CPUs" % os.cpu_count(),
           "results": results, "summary": summary, "teardown_ms": dist(teardowns),
           "teardown_samples_ms": [round(x, 2) for x in teardowns],
           "teardown_impl": teardown_impl(results)}
    if a.teardown_report:
        write_teardown_report(a, doc, results)
    if a.json:
        print(json.dumps(doc, indent=1))
    else:
        print(table(results, COLS))
        print("summary: %s" % json.dumps(summary))
        print("teardown (declare dead -> proven torn down), ms: %s" % json.dumps(dist(teardowns)))
        print("wall %.1f s" % wall)
    if bad:
        print("FAIL: kvfence corrupted, lost or let a fenced host's bytes land: %s" % json.dumps(
            [{k: r.get(k) for k in ("scenario", "corrupted_requests", "corrupted_pages",
                                    "lost_pages", "fenced_host_landings_after_heal")}
             for r in bad]), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
