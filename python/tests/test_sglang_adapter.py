"""kvfence.sglang without SGLang: what can be checked in any environment (configuration,
the version gate, all-or-nothing patching, the teardown proof's kernel facts, the start-up
hook). The adapter against SGLang itself is checked by e2e/sglang/ (SGLang's own PD code
and its own unit tests)."""

import os
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


def test_install_refuses_another_sglang_and_changes_nothing(monkeypatch):
    monkeypatch.setattr(ks, "_sglang_version", lambda: "0.5.22")
    with pytest.raises(ks.UnsupportedSGLangVersion, match=r"0\.5\.22") as e:
        ks.install()
    assert "0.5.23" in str(e.value)
    assert not ks.installed()
    ks.uninstall()  # a no-op when not installed


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


def test_teardown_facts_on_real_sockets():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    port = srv.getsockname()[1]
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
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    port = srv.getsockname()[1]
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


def test_startup_hook_is_inert_without_the_variable(monkeypatch):
    monkeypatch.delenv("KVFENCE_SGLANG", raising=False)
    n = len(sys.meta_path)
    _startup.maybe_hook()
    assert len(sys.meta_path) == n


def test_startup_hook_arms_a_one_shot_finder(monkeypatch):
    monkeypatch.setenv("KVFENCE_SGLANG", "1")
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    sys.modules.pop(_startup.TRIGGER, None)
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
    from sglang.srt.disaggregation.common.conn import CommonKVManager, CommonKVReceiver
    from sglang.srt.disaggregation.decode import DecodeTransferQueue

    if ks.installed():
        pytest.skip("installed by the start-up hook in this process")
    before = {(c, n): c.__dict__[n] for c, n in [
        (CommonKVReceiver, "send_metadata"), (CommonKVManager, "note_abort_ack"),
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
    pytest.importorskip("sglang.srt.disaggregation.mooncake.conn")
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, KVFENCE_SGLANG="0")
    p = subprocess.run([sys.executable, os.path.join(here, "sglang_release_path_check.py")],
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "release path OK" in p.stdout, p.stdout[-2000:] + p.stderr[-4000:]


# -- the decode gate's admission (rooms open at the abort), on the gate itself ----------

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


def _recv(mgr, room):
    """A receiver whose destinations go to prefill ranks 0 and 1 of _ADDR."""
    return SimpleNamespace(
        kv_mgr=mgr, bootstrap_room=room, bootstrap_addr=_ADDR, prefill_info=_INFO,
        target_cp_ranks=[0], target_tp_ranks=[0, 1], target_pp_ranks=[0],
        bootstrap_infos=[{"rank_ip": "10.0.0.1", "rank_port": 7000},
                         {"rank_ip": "10.0.0.1", "rank_port": 7001}])


def _admit(gate, r):
    return gate.admit(r, list(range(4)), 0, None)


def test_a_successful_request_never_opens_a_room(monkeypatch):
    """send_metadata admits; a clear with status Success forgets the admission (no room
    ever opened); a clear of a failed request keeps it for the abort that follows
    (SGLang's failure_exception() clears first), which opens the room."""
    gate = kdec.DecodeGate(kvfence.RoomTable(64))
    mgr = _Mgr()
    mgr._kvfence_gate = gate
    monkeypatch.setattr(kdec, "_SUCCESS", "Success")
    clear = kdec._clear(lambda self: None)
    rs = [_recv(mgr, i) for i in range(10)]
    assert all(_admit(gate, r) for r in rs)
    assert _admit(gate, rs[0])  # sent again: still one admission
    assert gate.admitted == 10 and gate.table.stats()["rooms_owned"] == 0
    for r in rs[:9]:
        mgr.request_status[r.bootstrap_room] = "Success"
        clear(r)
    mgr.request_status[9] = "Failed"
    clear(rs[9])
    assert gate.admitted == 1 and not gate.records
    assert gate.table.stats()["rooms_owned"] == 0
    h = gate.open_admitted(rs[9])
    assert h is not None and rs[9]._kvfence_handle == h and gate.admitted == 0
    assert gate.records[h].writers == gate.ranks.of(_ADDR) and gate.room_handle[9] == h
    assert gate.open_admitted(rs[0]) is None  # it succeeded: a later abort is SGLang's own
    assert gate.table.stats()["rooms_owned"] == 1


def test_a_writer_fenced_after_admission_is_left_out_of_its_room():
    """A rank fenced between a request's admission and its abort (its transport torn
    down: it writes nothing more) is not a writer of the room opened at the abort; with
    every writer fenced the room has none, and its abort releases it."""
    gate = kdec.DecodeGate(kvfence.RoomTable(64))
    mgr = _Mgr()
    r1, r2 = _recv(mgr, 1), _recv(mgr, 2)
    assert _admit(gate, r1) and _admit(gate, r2)
    ranks = gate.retire(_ADDR)
    assert len(ranks) == 2
    gate.fence(_ADDR, ranks[:1], "test")
    h1 = gate.open_admitted(r1)
    assert h1 is not None and gate.records[h1].writers == ranks[1:]
    assert gate.table.abort(h1) == ranks[1:]  # only the live writer is told
    gate.fence(_ADDR, ranks[1:], "test")  # releases h1
    h2 = gate.open_admitted(r2)
    assert h2 is not None and gate.records[h2].writers == []
    assert gate.table.abort(h2) == []
    gate.drain()
    assert gate.decided == {h1: "aborted", h2: "aborted"}
    assert gate.unguarded_rooms == 0


def test_admission_promises_a_room_at_the_abort():
    """Admitted requests and open rooms together never exceed the table: the request
    past that is refused at send_metadata (failed, nothing sent), so no abort finds the
    table full."""
    pytest.importorskip("sglang.srt.disaggregation.base.conn")
    gate = kdec.DecodeGate(kvfence.RoomTable(2))
    mgr = _Mgr()
    a, b, c = (_recv(mgr, i) for i in range(3))
    assert _admit(gate, a) and _admit(gate, b)
    assert not _admit(gate, c)
    assert mgr.failed and mgr.failed[-1][0] == 2 and "promised" in mgr.failed[-1][1]
    assert getattr(c, "_kvfence_admitted", None) is None
    assert gate.open_admitted(a) is not None and gate.open_admitted(b) is not None
    assert gate.unguarded_rooms == 0 and gate.admitted == 0


def test_a_fence_waits_for_requests_admitted_to_the_dead_prefill(monkeypatch):
    """The heartbeat declares a prefill dead while a request to it is admitted (no room
    yet): the fence thread keeps waiting for the teardown proof instead of deciding that
    nothing waits on the prefill; once the proof holds it fences, and the request's
    abort then opens a room with no writer."""
    monkeypatch.setattr(ks._state, "config", ks.Config(teardown_poll=0.02))
    gate = kdec.DecodeGate(kvfence.RoomTable(64))
    torn = threading.Event()
    gate.proof = lambda host, eps: torn.is_set()
    r = _recv(mgr=_Mgr(), room=1)
    assert _admit(gate, r)
    gate.node_failed(_ADDR)
    time.sleep(0.3)  # 15 polls
    name = "kvfence-fence-%s" % _ADDR
    assert gate.fenced_ranks == 0
    assert any(t.name == name for t in threading.enumerate()), "the fence thread gave up"
    torn.set()
    deadline = time.monotonic() + 10
    while gate.fenced_ranks < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert gate.fenced_ranks == 2
    h = gate.open_admitted(r)
    assert h is not None and gate.records[h].writers == []
