"""A real SGLang prefill/decode pair on this machine, and the router in front of it.

Two ``python -m sglang.launch_server`` processes of SGLang 0.5.23 on its in-tree CPU
platform (``SGLANG_USE_CPU_ENGINE=1``, ``torch_native`` attention), disaggregated over
Mooncake's TCP transport on loopback (``MOONCAKE_PROTOCOL=tcp``, ``MC_FORCE_TCP=1``,
``SGLANG_HOST_IP=127.0.0.1``): stock, or with kvfence enabled as a user enables it
(``SGLANG_PLUGINS=kvfence``: SGLang's own plugin framework loads kvfence's entry point
``kvfence.sglang._plugin:register`` in its scheduler processes; no patch, no code).

Test-side parts, both rules alike (``sglang_site/``, on the servers' ``PYTHONPATH``):
the ``sgl_kernel`` stand-in (fails loudly if called; proven uncalled after each run) and
``sitecustomize`` (one CPU workaround, the fault injection at the transfer call, the
decode pause, a page log). The other CPU workaround is a flag:
``--disaggregation-decode-retraction-backup cpu_tensor`` (the default pins host memory
through CUDA).

The decode's pool is small (``DECODE_TOKENS`` KV slots, page size 1): room for two
requests, so that once its never-used slots run out SGLang's allocator merges the freed
ones back in sorted order and hands the lowest slots (those of the first request) out
again: the slots a failed request was given are reused a couple of requests later. The
deferred-release deadline is shortened to ``RELEASE_TIMEOUT_S`` (SGLang's default is
30 s; the same race, slower).

The router is the minimal PD router: the same ``/generate`` (prompt as token ids) to the
prefill and to the decode at once, with ``bootstrap_host``/``bootstrap_port``/
``bootstrap_room``; the answer is the decode's ``output_ids``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import requests

import inflight
from ctl import CtlDir

HERE = os.path.dirname(os.path.abspath(__file__))
SITE = os.path.join(HERE, "sglang_site")

#: SGLang's deferred-release deadline, shortened from its 30 s default to keep runs short.
RELEASE_TIMEOUT_S = 4.0
#: The decode's KV slots: two 100-token requests and their decode tokens, not three
#: (plus 100 per failed request kvfence will hold: see ``serve_sglang.decode_tokens``).
DECODE_TOKENS = 300
#: SGLang's failed-session probe interval, shortened from 30 s (see ``Server``).
PROBE_S = 1.0
PREFILL_TOKENS = 8192
MAX_TOKENS_CAP = 64


class Server:
    """One SGLang server (``sglang.launch_server``), its log in ``logdir``."""

    def __init__(self, name: str, role: str, port: int, rule: str, model: str, logdir: str,
                 python: str, ctl: str, bootstrap_port: int = 0, decode_tokens: int = DECODE_TOKENS,
                 extra_env: Optional[Dict[str, str]] = None, cgroup: Optional[str] = None) -> None:
        self.name, self.role, self.port, self.rule = name, role, port, rule
        self.bootstrap_port = bootstrap_port
        self.url = f"http://127.0.0.1:{port}"
        args = [python, "-m", "sglang.launch_server", "--model-path", model,
                "--host", "127.0.0.1", "--port", str(port), "--device", "cpu",
                "--dtype", "float32", "--attention-backend", "torch_native",
                "--disable-radix-cache", "--disable-overlap-schedule", "--random-seed", "0",
                "--skip-server-warmup", "--enable-metrics", "--max-running-requests", "4",
                # torch.distributed's rendezvous port: SGLang picks a free one at start-up
                # unless told, and six servers starting at once picked the same one
                # (EADDRINUSE, a server killed: seen 2026-12-06); one per server instead
                "--nccl-port", str(port + 20000),
                "--disaggregation-mode", role, "--disaggregation-transfer-backend", "mooncake"]
        if role == "prefill":
            args += ["--disaggregation-bootstrap-port", str(bootstrap_port),
                     "--max-total-tokens", str(PREFILL_TOKENS)]
        else:
            args += ["--disaggregation-decode-retraction-backup", "cpu_tensor",
                     "--max-total-tokens", str(decode_tokens), "--num-reserved-decode-tokens", "32"]
        env = dict(os.environ)
        for k in ("SGLANG_PLUGINS", "KVFENCE_SGLANG"):
            env.pop(k, None)
        env.update(
            SGLANG_USE_CPU_ENGINE="1", MOONCAKE_PROTOCOL="tcp", MC_FORCE_TCP="1",
            SGLANG_HOST_IP="127.0.0.1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
            OMP_NUM_THREADS="1",
            SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT=str(RELEASE_TIMEOUT_S),
            # A failed write blacklists the decode's Mooncake session on the prefill until
            # SGLang's own probe finds it alive (every 30 s by default): probe every 1 s.
            SGLANG_FAILED_SESSION_PROBE_INTERVAL_S=str(PROBE_S),
            SGLANG_FAILED_SESSION_PROBE_MAX_INTERVAL_S=str(2 * PROBE_S),
            PYTHONPATH=SITE + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""),
            KVFENCE_SERVE_CTL=ctl, KVFENCE_SERVE_ROLE=role,
            KVFENCE_STANDIN_CALLS=os.path.join(logdir, "standin-calls.txt"),
        )
        if rule in ("kvfence", "reset"):
            env["SGLANG_PLUGINS"] = "kvfence"  # what a user sets: SGLang's plugin allowlist
        if rule == "reset":
            # kvfence with its transport reset (kvfence.sglang.reset): a failed write's
            # slots come back once the decode proves the old transport gone.
            env["KVFENCE_SGLANG_RESET"] = "1"
        env.update(extra_env or {})
        self.log_path = os.path.join(logdir, f"{name}.log")
        self.log = open(self.log_path, "w")
        #: the cgroup (v2) it runs in, if any (``inflight``: its packets can be held)
        self.cgroup = cgroup
        if cgroup is not None:
            # into the cgroup before exec, so every process it forks is in it too
            args = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"',
                    inflight.cgroup(cgroup)] + args
        self.proc = subprocess.Popen(args, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def wait_ready(self, timeout: float) -> None:
        t0 = time.time()
        while time.time() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.proc.returncode}); see {self.log_path}")
            try:
                if requests.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(2)
        raise TimeoutError(f"{self.name} not up after {timeout:.0f} s; see {self.log_path}")

    def metrics(self) -> Dict[str, float]:
        """SGLang's own ``/metrics``: every sample, label sets summed per name."""
        out: Dict[str, float] = {}
        try:
            text = requests.get(self.url + "/metrics", timeout=5).text
        except requests.RequestException:
            return out
        for m in re.finditer(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? ([0-9.eE+-]+)$", text, re.M):
            key = m.group(1) + (m.group(2) or "")
            out[key] = out.get(key, 0.0) + float(m.group(3))
        return out

    def used_tokens(self) -> Optional[int]:
        """KV slots in use now, from SGLang's own scheduler state (``/v1/loads``:
        ``num_used_tokens``, computed when asked; the ``/metrics`` gauges are only
        refreshed while the scheduler is busy or fully idle, and a held deferred release
        keeps it from being fully idle)."""
        try:
            text = requests.get(self.url + "/v1/loads?format=prometheus", timeout=5).text
        except requests.RequestException:
            return None
        m = re.search(r"^sglang_num_used_tokens\{[^}]*\} ([0-9.eE+-]+)$", text, re.M)
        return int(float(m.group(1))) if m else None

    def log_text(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def wait_log(self, needle: str, timeout: float, after: int = 0) -> bool:
        """Waits until ``needle`` occurs in the log past offset ``after``."""
        t0 = time.time()
        while time.time() - t0 < timeout:
            if needle in self.log_text()[after:]:
                return True
            time.sleep(0.1)
        return False

    def signal(self, sig: int) -> None:
        os.killpg(self.proc.pid, sig)

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=20)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait()
        self.log.close()


class Pair(CtlDir):
    """A prefill and a decode server, the control directory of their hooks, the router."""

    def __init__(self, rule: str, model: str, logdir: str, python: str, base_port: int,
                 decode_tokens: int = DECODE_TOKENS, second_prefill: bool = False) -> None:
        self.rule = rule
        self.model, self.logdir, self.python = model, logdir, python
        self._restarts = 0
        self.ctl = os.path.join(logdir, f"ctl-{rule}")
        os.makedirs(self.ctl, exist_ok=True)
        for f in os.listdir(self.ctl):
            os.unlink(os.path.join(self.ctl, f))
        self.prefill = Server(f"sglang-{rule}-prefill", "prefill", base_port, rule, model, logdir,
                              python, self.ctl, bootstrap_port=base_port + 100)
        self.decode = Server(f"sglang-{rule}-decode", "decode", base_port + 1, rule, model, logdir,
                             python, self.ctl, decode_tokens=decode_tokens)
        self.decode_tokens = decode_tokens
        # A second prefill instance (its own process, bootstrap server and transfer queue),
        # so that a write held on the first and a later request's write can race.
        self.prefill_b: Optional[Server] = None
        #: the second prefill's cgroup (``inflight``), or None where holds cannot be made
        self.b_cgroup = None if inflight.unavailable() else f"kvfence-serve-{rule}-b"
        if second_prefill:
            self.prefill_b = Server(f"sglang-{rule}-prefill-b", "prefill", base_port + 2, rule, model,
                                    logdir, python, self.ctl, bootstrap_port=base_port + 102,
                                    cgroup=self.b_cgroup)
        self._room = int(time.time()) % 100000 * 1000
        self._room_lock = threading.Lock()  # next_room is called from clients' threads

    def restart_prefill_b(self, timeout: float = 900.0) -> float:
        """Starts the second prefill instance again (after its kill -9), on the same ports,
        its log in a new file; returns the seconds it took to be up."""
        old = self.prefill_b
        assert old is not None
        old.stop()
        self._restarts += 1
        t0 = time.time()
        self.prefill_b = Server(f"{old.name}-r{self._restarts}", "prefill", old.port, self.rule,
                                self.model, self.logdir, self.python, self.ctl,
                                bootstrap_port=old.bootstrap_port, cgroup=self.b_cgroup)
        self.prefill_b.wait_ready(timeout)
        return time.time() - t0

    def wait_ready(self, timeout: float = 900.0) -> None:
        self.prefill.wait_ready(timeout)
        self.decode.wait_ready(timeout)
        if self.prefill_b is not None:
            self.prefill_b.wait_ready(timeout)

    def stop(self) -> None:
        self.prefill.stop()
        self.decode.stop()
        if self.prefill_b is not None:
            self.prefill_b.stop()

    # the control files of sglang_site/sitecustomize.py
    def abort(self, rid: str) -> int:
        """Aborts request ``rid`` at the decode (SGLang's ``/abort_request``, what a client
        disconnect or a router does): its HTTP status."""
        return requests.post(self.decode.url + "/abort_request", json={"rid": rid}, timeout=30).status_code

    def next_room(self) -> int:
        with self._room_lock:
            self._room += 1
            return self._room

    @staticmethod
    def _body(prompt: List[int], max_tokens: int, room: int, pf: Server) -> Dict[str, Any]:
        """The router's ``/generate`` body: greedy, exactly ``max_tokens``, the room and
        the bootstrap server of prefill ``pf``."""
        return {"input_ids": prompt,
                "sampling_params": {"temperature": 0.0, "max_new_tokens": max_tokens,
                                    "min_new_tokens": max_tokens, "ignore_eos": True},
                "bootstrap_host": "127.0.0.1", "bootstrap_port": pf.bootstrap_port,
                "bootstrap_room": room}

    def hang_up(self, prompt: List[int], max_tokens: int, at_chunk: int, delay: float,
                prefill: Optional[Server] = None, room: Optional[int] = None,
                until: Optional[Callable[[], bool]] = None) -> Dict[str, Any]:
        """A client that hangs up: the request as ``generate`` sends it, but streamed, and
        both connections (the prefill's and the decode's, as a router drops both when its
        client goes) closed once the decode has streamed ``at_chunk`` tokens (0: ``delay``
        seconds after sending, while the request waits for its slots or its KV write; or,
        with ``until``, once ``until()`` returns, whatever it returns).
        SGLang aborts a request whose client is gone (its HTTP server's disconnect check).
        Returns what was seen: ``chunks`` streamed, ``finished`` if it ended first."""
        room = self.next_room() if room is None else room
        pf = prefill or self.prefill
        body = self._body(prompt, max_tokens, room, pf)
        body["stream"] = True
        seen: Dict[str, Any] = {"chunks": 0, "finished": False, "room": room}
        gone = threading.Event()

        def stream(srv: Server) -> None:
            try:
                with requests.post(srv.url + "/generate", json=body, stream=True, timeout=300) as r:
                    if srv is not self.decode:
                        gone.wait(300)  # the prefill's connection goes when the client goes
                        return
                    if at_chunk == 0:
                        if until is not None:
                            until()
                        else:
                            gone.wait(delay)
                        return
                    for line in r.iter_lines():
                        if line.strip() == b"data: [DONE]":
                            seen["finished"] = True
                        elif line.startswith(b"data:"):
                            seen["chunks"] += 1
                            if seen["chunks"] >= at_chunk:
                                return
            except requests.RequestException:
                pass
            finally:
                gone.set()

        tp = threading.Thread(target=stream, args=(pf,))
        tp.start()
        stream(self.decode)
        tp.join(30)
        return seen

    def generate(self, prompt: List[int], max_tokens: int, room: Optional[int] = None,
                 timeout: float = 300.0, prefill: Optional[Server] = None,
                 rid: Optional[str] = None) -> Tuple[List[int], float, Dict[str, Any]]:
        """One request through the pair (through ``prefill``, default the first):
        (output token ids, latency, the decode's meta_info). Raises on an HTTP error or an
        aborted request."""
        room = self.next_room() if room is None else room
        pf = prefill or self.prefill
        body = self._body(prompt, max_tokens, room, pf)
        if rid is not None:
            body["rid"] = rid
        res: Dict[str, Any] = {}

        def post(srv: Server) -> None:
            try:
                res[srv.role] = requests.post(srv.url + "/generate", json=body, timeout=timeout)
            except requests.RequestException as e:
                res[srv.role] = e

        t0 = time.perf_counter()
        tp = threading.Thread(target=post, args=(pf,))
        tp.start()
        post(self.decode)
        dt = time.perf_counter() - t0
        tp.join(timeout)
        r = res["decode"]
        self.last_prefill_answer = res.get("prefill")
        if isinstance(r, Exception):
            raise r
        if r.status_code != 200:
            raise RuntimeError(f"decode HTTP {r.status_code}: {r.text[:300]}")
        j = r.json()
        meta = j.get("meta_info", {})
        fr = meta.get("finish_reason") or {}
        if isinstance(fr, dict) and fr.get("type") == "abort":
            raise RuntimeError(f"aborted: {fr.get('message')}")
        ids = j.get("output_ids")
        if ids is None:
            raise RuntimeError(f"no output_ids in the decode's answer: {sorted(j)}")
        return list(ids), dt, meta


if __name__ == "__main__":  # smoke: python sglang_pair.py MODEL_DIR LOGDIR RULE
    import sys

    import model as _model

    data = _model.load(sys.argv[1])
    os.makedirs(sys.argv[2], exist_ok=True)
    pair = Pair(sys.argv[3], data["model"], sys.argv[2], sys.executable, 8300)
    try:
        t0 = time.time()
        pair.wait_ready()
        print("up in", round(time.time() - t0), "s", flush=True)
        for i in range(3):
            out, dt, meta = pair.generate(data["prompts"][i], data["max_tokens"])
            print(out == data["tokens"][i], round(dt, 3), out, flush=True)
        print("used tokens at idle:", pair.decode.used_tokens())
    finally:
        pair.stop()
