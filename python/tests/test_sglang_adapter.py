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
                     "kvfence_sglang_quarantined_pages_total"):
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
