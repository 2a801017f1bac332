"""kvfence.sglang without SGLang: what can be checked in any environment (configuration,
the version gate, all-or-nothing patching, the teardown proof's kernel facts, the start-up
hook). The adapter against SGLang itself is checked by e2e/sglang/ (SGLang's own PD code
and its own unit tests)."""

import os
import re
import socket
import subprocess
import sys

import pytest

import kvfence.sglang as ks
from kvfence.sglang import _startup, teardown
from kvfence.sglang._patching import Patch, PatchSet


def test_config_defaults_and_env():
    c = ks.Config.from_env({})
    assert (c.rooms, c.quarantine_after, c.overdue_after, c.metrics) == (65536, None, 30.0, True)
    c = ks.Config.from_env({"KVFENCE_SGLANG_QUARANTINE_AFTER": "4.5",
                            "KVFENCE_SGLANG_ROOMS": "8", "KVFENCE_SGLANG_METRICS": "0"})
    assert (c.rooms, c.quarantine_after, c.metrics) == (8, 4.5, False)
    assert ks.Config.from_env({"KVFENCE_SGLANG_QUARANTINE_AFTER": "never"}).quarantine_after is None


@pytest.mark.parametrize("name,value", [
    ("KVFENCE_SGLANG_QUARANTINE_AFTER", "-1"),
    ("KVFENCE_SGLANG_QUARANTINE_AFTER", "soon"),
    ("KVFENCE_SGLANG_QUARANTINE_AFTER", "nan"),
    ("KVFENCE_SGLANG_ROOMS", "0"),
    ("KVFENCE_SGLANG_ROOMS", "many"),
])
def test_config_bad_values_are_clear_errors(name, value):
    with pytest.raises(ValueError, match=name):
        ks.Config.from_env({name: value})


def _sglang_copy_with_one_hook_changed(tmp_path):
    """A copy of the installed SGLang's disaggregation sources (the files the hook
    digests read) with one hooked method changed: its root, for installed_root()."""
    import shutil

    from kvfence import _sglang_hooks

    root = _sglang_hooks.installed_root()
    assert root is not None
    dst = os.path.join(str(tmp_path), _sglang_hooks._DISAGG)
    shutil.copytree(os.path.join(root, _sglang_hooks._DISAGG), dst)
    path = os.path.join(dst, "common", "conn.py")
    text = open(path).read()
    marker = '''"""Record an ACK only for the generation currently holding the room."""'''
    assert text.count(marker) == 1
    open(path, "w").write(text.replace(marker, '"""Changed."""'))
    return str(tmp_path)


def test_install_decides_support_by_the_code_not_the_version(monkeypatch, tmp_path):
    """The installed SGLang's hooks match the row of its own release (0.5.22 or 0.5.23),
    whatever its version string says (a local suffix changes nothing); a copy of it with
    one hooked method changed is refused, nothing changed, the error naming the
    version found, the supported range and the method that differs."""
    pytest.importorskip("sglang.srt.disaggregation.mooncake.conn")
    from importlib.metadata import version

    from kvfence import _sglang_hooks

    if ks.installed():
        pytest.skip("installed by the start-up hook in this process")
    found = version("sglang")
    root = _sglang_hooks.installed_root()
    assert _sglang_hooks.match(_sglang_hooks.digests(root)) == (found, [])
    assert set(ks.SUPPORTED_SGLANG) == {"0.5.22", "0.5.23"}
    monkeypatch.setattr(ks, "_sglang_version", lambda: found + "+local")
    ks.install()
    try:
        assert ks.installed()
    finally:
        ks.uninstall()
    changed = _sglang_copy_with_one_hook_changed(tmp_path)
    monkeypatch.setattr(_sglang_hooks, "installed_root", lambda: changed)
    with pytest.raises(ks.UnsupportedSGLangVersion,
                       match=r"supports SGLang 0\.5\.22 - 0\.5\.23 only; the installed SGLang "
                             r"is %s\+local, whose code differs .* in "
                             r"CommonKVManager\.note_abort_ack\." % re.escape(found)):
        ks.install()
    assert not ks.installed()
    ks.uninstall()  # a no-op when not installed


def test_each_release_has_its_own_decode_patch_table():
    """0.5.22's metadata goes out through MooncakeKVReceiver.send_metadata (no
    destination parameter), 0.5.23's through CommonKVReceiver's: each release's table
    wraps the method that release calls, and only that one."""
    pytest.importorskip("sglang.srt.disaggregation.mooncake.conn")
    from importlib.metadata import version

    from kvfence.sglang import decode as kdec

    table = {(o.__name__, n) for o, n, _ in kdec.patches(version("sglang"))}
    if version("sglang") == "0.5.22":
        assert ("MooncakeKVReceiver", "send_metadata") in table
        assert ("CommonKVReceiver", "send_metadata") not in table
    else:
        assert ("CommonKVReceiver", "send_metadata") in table
        assert ("MooncakeKVReceiver", "send_metadata") not in table
    with pytest.raises(ValueError, match="0.5.21"):
        kdec.patches("0.5.21")


def test_install_without_sglang_is_a_clear_error():
    try:
        import sglang  # noqa: F401
    except ImportError:
        with pytest.raises(ks.UnsupportedSGLangVersion, match="not installed"):
            ks.install()
        assert not ks.installed()
    else:
        pytest.skip("SGLang is installed here")


class _Target:
    def a(self):
        return "a"

    def b(self):
        return "b"


def test_patchset_is_all_or_nothing_and_restores():
    wrap = lambda orig: (lambda self: "wrapped " + orig(self))  # noqa: E731
    bad = PatchSet([Patch(_Target, "a", wrap), Patch(_Target, "missing", wrap)])
    assert bad.check() == ["_Target.missing"]
    orig_a, orig_b = _Target.__dict__["a"], _Target.__dict__["b"]
    good = PatchSet([Patch(_Target, "a", wrap), Patch(_Target, "b", wrap)])
    assert good.check() == []
    good.apply()
    assert (_Target().a(), _Target().b()) == ("wrapped a", "wrapped b")
    good.undo()
    assert _Target.__dict__["a"] is orig_a and _Target.__dict__["b"] is orig_b


def _listener() -> "tuple[socket.socket, int]":
    """A listening TCP socket on 127.0.0.1 (a port of this process), and its port."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    return srv, srv.getsockname()[1]


def test_teardown_facts_on_real_sockets():
    srv, port = _listener()
    before = teardown.inbound_sockets_from("127.0.0.1")
    cli = socket.create_connection(("127.0.0.1", port))
    acc, _ = srv.accept()
    # An accepted socket from the peer's address is counted (our own client end is ours:
    # it is not on a listening port, and a self-connection is excluded).
    assert teardown.inbound_sockets_from("127.0.0.1") >= before
    assert not teardown.endpoint_refuses("127.0.0.1", port)
    assert not teardown.mooncake_tcp_torn_down("127.0.0.1", [("127.0.0.1", port)])
    cli.close()
    acc.close()
    srv.close()
    assert teardown.endpoint_refuses("127.0.0.1", port)
    assert not teardown.mooncake_tcp_torn_down("127.0.0.1", [])  # nothing known: no proof


def test_teardown_counts_a_peer_connection_into_a_listener():
    # A child process (the "peer") connects to our listener: the accepted socket is an
    # inbound socket from its address until it exits.
    srv, port = _listener()
    peer = subprocess.Popen([sys.executable, "-c",
                             "import socket,sys,time;s=socket.create_connection(('127.0.0.1',%d));"
                             "sys.stdout.write('x');sys.stdout.flush();time.sleep(30)" % port],
                            stdout=subprocess.PIPE)
    acc, _ = srv.accept()
    assert peer.stdout.read(1) == b"x"
    assert teardown.inbound_sockets_from("127.0.0.1") >= 1
    peer.kill()
    peer.wait()
    acc.close()
    srv.close()
    assert teardown.inbound_sockets_from("127.0.0.1") == 0


def _peer(port: int, listen: bool) -> "subprocess.Popen[bytes]":
    """A child process that connects to ``port`` (and first, with ``listen``, listens on a
    port of its own, as a prefill rank serves its ZMQ endpoint); it prints its own port
    (0 without ``listen``), then waits."""
    code = ("import socket,sys,time\n"
            "l=socket.socket();l.bind(('127.0.0.1',0));l.listen()\n" if listen else
            "import socket,sys,time\nl=None\n")
    code += ("s=socket.create_connection(('127.0.0.1',%d))\n"
             "sys.stdout.write('%%06d' %% (l.getsockname()[1] if l else 0));sys.stdout.flush()\n"
             "time.sleep(60)\n" % port)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)


def test_teardown_tells_a_live_instance_on_the_same_host_from_the_dead_one():
    # Two "prefill instances" on this host connect to our listener (Mooncake's TCP
    # listener on the decode): A also serves a rank endpoint; B is killed -9. A's socket
    # must not hold B's proof back once A is known as a live instance; B's must, while
    # it is open; nothing is excluded without `others`.
    srv, port = _listener()
    base = teardown.inbound_sockets_from("127.0.0.1")
    a = _peer(port, listen=True)
    acc_a, _ = srv.accept()
    a_ep = ("127.0.0.1", int(a.stdout.read(6)))
    b = _peer(port, listen=False)
    acc_b, _ = srv.accept()
    assert b.stdout.read(6) == b"000000"
    b_ep = ("127.0.0.1", 1)  # B's endpoint: nothing listens there (refuses)
    try:
        assert teardown.inbound_sockets_from("127.0.0.1") == base + 2
        # B alive: its socket counts, A's does not
        assert teardown.inbound_sockets_from("127.0.0.1", [a_ep]) == base + 1
        assert not teardown.mooncake_tcp_torn_down("127.0.0.1", [b_ep], [a_ep])
        b.kill()
        b.wait()
        # B's end is closed by the kernel; ours stays (CLOSE_WAIT) until we close it, as
        # Mooncake does on EOF: it still counts (bytes may be unread)
        assert teardown.inbound_sockets_from("127.0.0.1", [a_ep]) == base + 1
        acc_b.close()
        assert teardown.inbound_sockets_from("127.0.0.1", [a_ep]) == base
        if base == 0:
            assert teardown.mooncake_tcp_torn_down("127.0.0.1", [b_ep], [a_ep])
        # without A known as a live instance: A's socket holds the proof back (as before)
        assert not teardown.mooncake_tcp_torn_down("127.0.0.1", [b_ep])
        # A's own endpoint among the dead instance's endpoints excludes nothing
        assert not teardown.mooncake_tcp_torn_down("127.0.0.1", [b_ep, a_ep], [a_ep])
    finally:
        for p in (a, b):
            p.kill()
            p.wait()
        acc_a.close()
        acc_b.close()
        srv.close()


def test_startup_hook_is_inert_without_the_variable(monkeypatch):
    monkeypatch.delenv("KVFENCE_SGLANG", raising=False)
    n = len(sys.meta_path)
    _startup.maybe_hook()
    assert len(sys.meta_path) == n


def test_startup_hook_arms_a_one_shot_finder(monkeypatch):
    monkeypatch.setenv("KVFENCE_SGLANG", "1")
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    # (restored after the test: popping SGLang's module for good would make a later import
    # of it run again and register its Prometheus metrics twice)
    monkeypatch.delitem(sys.modules, _startup.TRIGGER, raising=False)
    _startup.maybe_hook()
    _startup.maybe_hook()  # idempotent
    finders = [f for f in sys.meta_path if isinstance(f, _startup._PostImportFinder)]
    assert len(finders) == 1
    assert finders[0].find_spec("json", None) is None  # only the trigger module


def test_run_wrapper_usage():
    assert _startup.run_main(["--help"]) == 0
    assert _startup.run_main([]) == 2


def test_snapshot_without_managers():
    s = ks.snapshot()
    assert s["installed"] is False and s["decode"] == [] and s["prefill"] == []
    assert set(s["metrics"]) >= {"held_pages", "overdue_rooms", "fenced_ranks",
                                 "quarantined_rooms", "quarantined_pages"}


def test_install_uninstall_on_the_real_sglang(monkeypatch):
    pytest.importorskip("sglang.srt.disaggregation.mooncake.conn")
    from sglang.srt.disaggregation.common.conn import CommonKVManager
    from sglang.srt.disaggregation.decode import DecodeTransferQueue

    if ks.installed():
        pytest.skip("installed by the start-up hook in this process")
    before = {(c, n): c.__dict__[n] for c, n in [
        (_send_metadata_owner(), "send_metadata"), (CommonKVManager, "note_abort_ack"),
        (DecodeTransferQueue, "resolve_deferred_releases")]}
    ks.install()
    try:
        ks.install()  # idempotent
        assert ks.installed()
        for (c, n), f in before.items():
            assert c.__dict__[n] is not f
            assert c.__dict__[n].__kvfence_original__ is f
    finally:
        ks.uninstall()
    assert not ks.installed()
    for (c, n), f in before.items():
        assert c.__dict__[n] is f


def _send_metadata_owner():
    """The class whose send_metadata SGLang's decode calls (and kvfence wraps):
    MooncakeKVReceiver on 0.5.22, CommonKVReceiver on 0.5.23."""
    from sglang.srt.disaggregation.common.conn import CommonKVReceiver
    from sglang.srt.disaggregation.mooncake.conn import MooncakeKVReceiver

    return MooncakeKVReceiver if "send_metadata" in MooncakeKVReceiver.__dict__ \
        else CommonKVReceiver


@pytest.mark.parametrize("target", ["send_metadata", "FastQueue.get"])
def test_install_refuses_a_mirrored_method_with_other_parameters(monkeypatch, target):
    """The wrappers on the hot paths mirror SGLang's parameters (each release's), so that
    they call SGLang with a plain positional call (no repacking): ``send_metadata`` (every
    request) and the prefill worker queue's ``get`` (every chunk). An SGLang whose method
    takes others is refused, nothing patched."""
    pytest.importorskip("sglang.srt.disaggregation.mooncake.conn")
    from sglang.srt.disaggregation.common.conn import CommonKVManager
    from sglang.srt.disaggregation.common.utils import FastQueue

    if ks.installed():
        pytest.skip("installed by the start-up hook in this process")

    def other(self, kv_indices=None, extra=None):
        raise AssertionError("not called")

    if target == "send_metadata":
        owner, name = _send_metadata_owner(), "send_metadata"
    else:
        owner, name = FastQueue, "get"
    # (the digests read the files, not the classes: the release is still recognized,
    # and the parameter check refuses)
    monkeypatch.setattr(owner, name, other)
    ack = CommonKVManager.__dict__["note_abort_ack"]
    with pytest.raises(RuntimeError, match=r"%s takes .*'extra'.*nothing was changed" % name):
        ks.install()
    assert not ks.installed()
    assert owner.__dict__[name] is other
    assert CommonKVManager.__dict__["note_abort_ack"] is ack


def test_metrics_are_exported_through_prometheus_client():
    prom = pytest.importorskip("prometheus_client")
    from kvfence.sglang import metrics

    assert metrics.register() and metrics.register()  # idempotent
    try:
        text = prom.generate_latest().decode()
        for name in ("kvfence_sglang_held_pages", "kvfence_sglang_overdue_rooms",
                     "kvfence_sglang_fenced_ranks_total", "kvfence_sglang_quarantined_rooms_total",
                     "kvfence_sglang_quarantined_pages_total",
                     "kvfence_sglang_unguarded_rooms_total"):
            assert name + " " in text, name
    finally:
        metrics.unregister()
    assert "kvfence_sglang_held_pages" not in prom.generate_latest().decode()


def test_release_path_on_the_real_decode_queue():
    """The benchmark's lifecycle at 1, 10 and 300 requests in flight, stock and kvfence
    (its own assertions: every aborted room held, exactly the ACKed ones released, the
    rest held in order, nothing left), then held entries with expired deadlines, also
    after an in-place clear of the held list: none may be released."""
    _run_check("sglang_release_path_check.py", "release path OK")


def _run_check(script: str, ok: str) -> None:
    """Runs one of this folder's check scripts in a subprocess (each builds SGLang
    objects and patches SGLang's module globals) and requires its success line."""
    pytest.importorskip("sglang.srt.disaggregation.mooncake.conn")
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, KVFENCE_SGLANG="0")
    p = subprocess.run([sys.executable, os.path.join(here, script)],
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and ok in p.stdout, p.stdout[-2000:] + p.stderr[-4000:]


def test_prefill_gate_alone_holds_the_ack_on_the_real_transfer_worker():
    """SGLang's real transfer_worker with SGLang's own drain count and poison set taken
    away, so that kvfence's prefill gate is the only guard: a write in flight at the
    ABORT holds its ACK until it is done; a write that returned -1 keeps its room from
    ever being ACKed (quarantined at clear()); a chunk queued behind the ABORT is never
    written. (A gate that begins no transfer per chunk, or does not fail one on -1,
    fails this: checked by hand, see the closing note of issue 19.)"""
    _run_check("sglang_prefill_gate_check.py", "prefill gate OK")


# -- the decode gate: a room opens at the abort of a request whose metadata went out -----

from types import SimpleNamespace  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

import kvfence  # noqa: E402
from kvfence.sglang import decode as kdec  # noqa: E402

_ADDR = "10.0.0.1:8998"
_INFO = SimpleNamespace(pp_size=1, attn_cp_size=1)


class _Mgr:
    """What the gate calls on a decode manager when it refuses a request."""

    def __init__(self):
        self.failed = []
        self.request_status = {}

    def record_failure(self, room, why):
        self.failed.append((room, why))

    def update_status(self, room, status):
        self.request_status[room] = status


def _recv(mgr, room, info=_INFO):
    """A receiver whose destinations go to prefill ranks 0 and 1 of _ADDR."""
    return SimpleNamespace(
        kv_mgr=mgr, bootstrap_room=room, bootstrap_addr=_ADDR, prefill_info=info,
        target_cp_ranks=[0], target_tp_ranks=[0, 1], target_pp_ranks=[0],
        bootstrap_infos=[{"rank_ip": "10.0.0.1", "rank_port": 7000},
                         {"rank_ip": "10.0.0.1", "rank_port": 7001}])


def _gate(rooms=64):
    gate = kdec.DecodeGate(kvfence.RoomTable(rooms))
    mgr = _Mgr()
    mgr._kvfence_gate = gate
    return gate, mgr


_sent = []  # what the wrapped send_metadata's SGLang method was called with
_send = kdec._send_metadata(lambda self, kv, aux, st, *a, **kw: _sent.append(self))


def test_a_sent_request_has_no_room_until_its_abort():
    """send_metadata (the real wrapper, SGLang's method a stub) keeps the writers and
    holds on the receiver and opens no room; a request never aborted never has one (its
    success needs nothing more); the abort of a sent one opens it, once."""
    gate, mgr = _gate()
    rs = [_recv(mgr, i) for i in range(10)]
    for r in rs:
        _send(r, list(range(4)), 0, None)
    _send(rs[0], list(range(8)), 0, None)  # sent again: the newer holds
    assert len(_sent) >= 11 and _sent[-1] is rs[0]
    assert gate.table.stats()["rooms_owned"] == 0 and not gate.records
    assert rs[0]._kvfence[1] == list(range(8))
    h = gate.open_at_abort(rs[9])
    assert h is not None and rs[9]._kvfence == h
    assert gate.records[h].writers == gate.ranks.of(_ADDR) and gate.room_handles[9] == (h,)
    assert gate.records[h].held_pages == 5
    assert gate.open_at_abort(rs[9]) is None  # opened once
    unsent = _recv(mgr, 99)
    assert gate.open_at_abort(unsent) is None  # nothing went out: SGLang's own
    assert gate.table.stats()["rooms_owned"] == 1 and gate.unguarded_rooms == 0


def test_a_writer_fenced_after_the_send_is_left_out_of_its_room():
    """A rank fenced between a request's send_metadata and its abort (its transport torn
    down: it writes nothing more) is not a writer of the room opened at the abort; with
    every writer fenced the room has none, and its abort releases it. The room waits on
    the ranks the metadata went to, not on those of a returning instance (new ids)."""
    gate, mgr = _gate()
    r1, r2 = _recv(mgr, 1), _recv(mgr, 2)
    _send(r1, list(range(4)), 0, None)
    _send(r2, list(range(4)), 0, None)
    ranks = gate.retire(_ADDR)
    assert len(ranks) == 2
    gate.fence(_ADDR, ranks[:1], "test")
    r3 = _recv(mgr, 3)  # sent after the retirement: the returning instance's ranks
    _send(r3, list(range(4)), 0, None)
    h1 = gate.open_at_abort(r1)
    assert h1 is not None and gate.records[h1].writers == ranks[1:]
    assert gate.table.abort(h1) == ranks[1:]  # only the live writer is told
    gate.fence(_ADDR, ranks[1:], "test")  # releases h1
    h2 = gate.open_at_abort(r2)
    assert h2 is not None and gate.records[h2].writers == []
    assert gate.table.abort(h2) == []
    h3 = gate.open_at_abort(r3)
    new = gate.records[h3].writers
    assert len(new) == 2 and not set(new) & set(ranks)
    gate.drain()
    assert gate.decided == {h1: "aborted", h2: "aborted"}
    assert gate.unguarded_rooms == 0


def test_an_abort_that_finds_the_table_full_holds_the_pages_for_good():
    """No room promised at send_metadata: an abort finding every room in use opens none,
    and that request's pages are held for good (never safe to release, counted as
    quarantined, logged), never released on SGLang's own ACK count or a deadline."""
    gate, mgr = _gate(rooms=2)
    a, b, c = (_recv(mgr, i) for i in range(3))
    for r in (a, b, c):
        _send(r, list(range(4)), 0, None)
    assert not mgr.failed  # nothing refused at the send
    assert gate.open_at_abort(a) is not None and gate.open_at_abort(b) is not None
    assert gate.open_at_abort(c) is None
    assert gate.held_for_good == {2: 5}
    assert gate.unguarded_rooms == 1 and gate.quarantined_rooms == 1
    assert gate.quarantined_pages == 5
    safe = kdec._is_abort_release_safe(lambda self, room, acks: True)
    assert safe(mgr, 2, 1) is False  # SGLang's own count would say yes
    assert safe(mgr, 77, 1) is True  # not kvfence's: SGLang's own


def test_an_abort_that_finds_the_table_full_of_undrained_releases_drains_them():
    """Released rooms whose releases no scheduler iteration drained yet (nothing was held)
    still hold their indices: an abort finding the table full drains them and opens its
    room, instead of holding its pages for good."""
    gate, mgr = _gate(rooms=2)
    a, b, c = (_recv(mgr, i) for i in range(3))
    for r in (a, b, c):
        _send(r, list(range(4)), 0, None)
    gate.drain()  # (the writer set's probe room, finished at the first send)
    ha, hb = gate.open_at_abort(a), gate.open_at_abort(b)
    assert ha is not None and hb is not None
    for h in (ha, hb):
        gate.table.abort(h)
        for w in gate.records[h].writers:
            gate.table.quiesce(h, w)  # every writer's ACK: released, not drained
    assert gate.table.queued_releases() == 2 and not gate.decided
    hc = gate.open_at_abort(c)
    assert hc is not None and not gate.held_for_good and gate.unguarded_rooms == 0
    assert gate.decided == {ha: "aborted", hb: "aborted"}


def test_a_writer_set_kvfence_cannot_gate_is_refused_at_the_send():
    """A writer set the table cannot open a room for (more writers than a room holds)
    fails the request at send_metadata: nothing is sent, so nothing needs holding."""
    pytest.importorskip("sglang.srt.disaggregation.base.conn")
    gate, mgr = _gate()
    r = _recv(mgr, 5)
    r.target_tp_ranks = list(range(80))  # more writers than a room's mask
    n = len(_sent)
    assert _send(r, list(range(4)), 0, None) is None
    assert len(_sent) == n  # SGLang's method was not called
    assert mgr.failed and mgr.failed[-1][0] == 5 and "writer set" in mgr.failed[-1][1]
    assert getattr(r, "_kvfence", None) is None


def test_a_fence_waits_for_sent_requests_to_the_dead_prefill(monkeypatch):
    """The heartbeat declares a prefill dead while a request sent to it is not aborted
    yet (no room): the fence thread keeps waiting for the teardown proof instead of
    deciding that nothing waits on the prefill; once the proof holds it fences, and the
    request's abort then opens a room with no writer. A request that SGLang reports
    successful, or has cleared, is not waited for."""
    monkeypatch.setattr(ks._state, "config", ks.Config(teardown_poll=0.02))
    monkeypatch.setattr(kdec, "_SUCCESS", "Success")
    gate, mgr = _gate()
    torn = threading.Event()
    gate.proof = lambda host, eps, others=(): torn.is_set()
    r = _recv(mgr, 1)
    _send(r, list(range(4)), 0, None)
    mgr.request_status = {1: "Failed", 2: "Success"}
    gate.node_failed(_ADDR, [1, 2, 3], mgr.request_status)
    time.sleep(0.3)  # 15 polls
    name = "kvfence-fence-%s" % _ADDR
    assert gate.fenced_ranks == 0
    assert any(t.name == name for t in threading.enumerate()), "the fence thread gave up"
    torn.set()
    deadline = time.monotonic() + 10
    while gate.fenced_ranks < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert gate.fenced_ranks == 2
    h = gate.open_at_abort(r)
    assert h is not None and gate.records[h].writers == []


def test_the_fence_reads_the_live_instances_at_each_poll(monkeypatch):
    """The proof's ``others`` (the rank endpoints of the live prefill instances, whose
    sockets on a host shared with the dead one do not count) is read from SGLang's
    connection pool at every poll, not once at the heartbeat failure. Found on a real pair
    (issue 41, ``prefill_killed`` with its bytes on the wire): the decode had talked only
    to the prefill that died, the requests after it went to another instance on the same
    host, and that instance's Mooncake sockets kept the dead one's room held until it was
    restarted, and then for good. Here the pool is empty at the failure; a second
    instance joins it later; the stub proof holds only once it is told about it."""
    monkeypatch.setattr(ks._state, "config", ks.Config(teardown_poll=0.02))
    monkeypatch.setattr(kdec, "_SUCCESS", "Success")
    gate, mgr = _gate()
    seen = []

    def proof(host, eps, others=()):
        seen.append(list(others))
        return ("127.0.0.9", 17001) in others

    gate.proof = proof
    r = _recv(mgr, 1)
    _send(r, list(range(4)), 0, None)
    mgr.request_status = {1: "Failed"}
    mgr.connection_lock = threading.Lock()
    mgr.connection_pool = {_ADDR + "_0_0": [{"rank_ip": "10.0.0.1", "rank_port": 7000}]}
    mgr.addr_to_rooms_tracker = {_ADDR: {1}}
    kdec._handle_node_failure(lambda self, addr: None)(mgr, _ADDR)  # SGLang's method a stub
    time.sleep(0.2)  # ~10 polls
    assert gate.fenced_ranks == 0 and seen and all(o == [] for o in seen)
    with mgr.connection_lock:
        mgr.connection_pool["127.0.0.9:8998_0_0"] = [{"rank_ip": "127.0.0.9", "rank_port": 17001}]
    deadline = time.monotonic() + 10
    while gate.fenced_ranks < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert gate.fenced_ranks == 2, "the fence never saw the instance that joined after the failure"
    assert seen[-1] == [("127.0.0.9", 17001)]


def test_a_fence_gives_up_when_no_sent_request_is_left(monkeypatch):
    """...and with every tracked request successful or cleared, and no room open, the
    thread ends without a proof (a live prefill is never fenced)."""
    monkeypatch.setattr(ks._state, "config", ks.Config(teardown_poll=0.02))
    monkeypatch.setattr(kdec, "_SUCCESS", "Success")
    gate, mgr = _gate()
    gate.proof = lambda host, eps, others=(): False
    gate.ranks.ids(_ADDR, [0, 1])
    gate.node_failed(_ADDR, [1, 2], {2: "Success"})
    name = "kvfence-fence-%s" % _ADDR
    deadline = time.monotonic() + 10
    while any(t.name == name for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(t.name == name for t in threading.enumerate())
    assert gate.fenced_ranks == 0


# -- SGLang's plugin framework --------------------------------------------------------------


def _load_plugins_with_kvfence(monkeypatch):
    """SGLang's real load_plugins(), its entry points reduced to kvfence's (as
    python/pyproject.toml registers it)."""
    from importlib.metadata import EntryPoint

    import sglang.srt.plugins as plugins

    ep = EntryPoint(name="kvfence", value="kvfence.sglang._plugin:register",
                    group="sglang.srt.plugins")
    monkeypatch.setattr(plugins, "entry_points",
                        lambda group: [ep] if group == "sglang.srt.plugins" else [])
    monkeypatch.setattr(plugins, "_plugins_loaded", False)
    plugins.load_plugins()


def test_sglang_plugins_enables_kvfence_through_sglangs_own_loader(monkeypatch, tmp_path):
    """SGLANG_PLUGINS=kvfence (read by SGLang's load_plugins) installs kvfence in the
    process; installed but not named (SGLANG_PLUGINS unset or naming others), it stays
    off; on an SGLang it does not support, the process stops with the supported versions
    named (SGLang's loader would only log an exception and run unprotected)."""
    pytest.importorskip("sglang.srt.plugins")
    pytest.importorskip("sglang.srt.disaggregation.mooncake.conn")
    if ks.installed():
        pytest.skip("installed by the start-up hook in this process")
    monkeypatch.delenv("KVFENCE_SGLANG", raising=False)
    for value in ("", "other"):
        monkeypatch.setenv("SGLANG_PLUGINS", value)
        _load_plugins_with_kvfence(monkeypatch)
        assert not ks.installed()
    monkeypatch.setenv("SGLANG_PLUGINS", "other,kvfence")
    try:
        _load_plugins_with_kvfence(monkeypatch)
        assert ks.installed()
    finally:
        ks.uninstall()
    from kvfence import _sglang_hooks

    monkeypatch.setattr(ks, "_sglang_version", lambda: "0.5.21")
    changed = _sglang_copy_with_one_hook_changed(tmp_path)
    monkeypatch.setattr(_sglang_hooks, "installed_root", lambda: changed)
    with pytest.raises(SystemExit, match=r"supports SGLang 0\.5\.22 - 0\.5\.23 .*0\.5\.21"):
        _load_plugins_with_kvfence(monkeypatch)
    assert not ks.installed()


def test_a_room_shared_with_a_request_held_for_good_is_never_safe_by_room():
    """Two requests on one bootstrap_room: the first gets a kvfence room, the second finds
    the table full (held for good). Once the first is released, a caller that asks by
    room only (SGLang's is_abort_release_safe outside its scan) must still hear "no":
    the other request of the room may never be released."""
    gate, mgr = _gate(rooms=1)
    r1, r2 = _recv(mgr, 5), _recv(mgr, 5)
    _send(r1, list(range(4)), 0, None)
    _send(r2, list(range(4)), 0, None)
    h1 = gate.open_at_abort(r1)
    assert h1 is not None and gate.open_at_abort(r2) is None
    assert 5 in gate.held_for_good
    gate.table.abort(h1)
    for w in gate.records[h1].writers:
        gate.table.quiesce(h1, w)
    gate.drain()
    assert h1 in gate.decided
    safe = kdec._is_abort_release_safe(lambda self, room, acks: True)
    assert safe(mgr, 5, 1) is False
