"""Starting and talking to the node processes (harness/node.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Dict, Optional

HERE = os.path.dirname(os.path.abspath(__file__))

# The process setup of shared/SGLANG.md section 1, scaled for a 2-core box.
BASE_ENV = {
    "SGLANG_HOST_IP": "127.0.0.1",
    "MOONCAKE_PROTOCOL": "tcp",
    "MC_FORCE_TCP": "1",
    "SGLANG_ENABLE_FAILED_SESSION_PROBE": "0",
    "SGLANG_DISAGGREGATION_QUEUE_SIZE": "1",
    "SGLANG_DISAGGREGATION_THREAD_POOL_SIZE": "1",
    # Heartbeat scaled down from 5 s x 2 misses to SGLang's minimum, 2 s x 1 miss (the
    # same code path).
    "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": "2.0",
    "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE": "1",
    "GLOG_minloglevel": "3",
    "TOKENIZERS_PARALLELISM": "false",
    "OMP_NUM_THREADS": "1",
}


class Node:
    def __init__(self, role: str, bootstrap_port: int, port: int, env: Dict[str, str],
                 python: str, logdir: str) -> None:
        self.role = role
        full = dict(os.environ)
        full.update(BASE_ENV)
        full.update(env)
        full["PYTHONPATH"] = os.path.dirname(HERE) + os.pathsep + full.get("PYTHONPATH", "")
        self.log_path = os.path.join(logdir, "%s-%d.log" % (role, port))
        self._log = open(self.log_path, "ab")
        self.p = subprocess.Popen(
            [python, "-m", "harness.node", role, str(bootstrap_port), str(port)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, env=full,
            cwd=os.path.dirname(HERE), text=True, bufsize=1)
        self.lock = threading.Lock()
        self.ready: Optional[Dict[str, Any]] = None

    def wait_ready(self, timeout: float = 240) -> Dict[str, Any]:
        line = self._readline(timeout)
        self.ready = json.loads(line)
        return self.ready

    def _readline(self, timeout: float) -> str:
        assert self.p.stdout is not None
        out: Dict[str, str] = {}

        def rd() -> None:
            assert self.p.stdout is not None
            out["line"] = self.p.stdout.readline()

        t = threading.Thread(target=rd, daemon=True)
        t.start()
        t.join(timeout)
        line = out.get("line")
        if not line:
            raise RuntimeError("%s: no reply (rc=%s); log %s:\n%s" % (
                self.role, self.p.poll(), self.log_path, self.tail()))
        return line

    def tail(self, n: int = 4000) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, 2)
                f.seek(max(0, f.tell() - n))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def call(self, timeout: float = 120, **cmd: Any) -> Dict[str, Any]:
        with self.lock:
            assert self.p.stdin is not None
            self.p.stdin.write(json.dumps(cmd) + "\n")
            self.p.stdin.flush()
            r = json.loads(self._readline(timeout))
        if not r.get("ok", False):
            raise RuntimeError("%s %s failed: %s\n%s" % (self.role, cmd.get("op"),
                               r.get("error"), r.get("trace", "")))
        return r

    def kill9(self) -> None:
        os.kill(self.p.pid, signal.SIGKILL)
        self.p.wait()

    def close(self) -> None:
        if self.p.poll() is None:
            try:
                self.call(timeout=5, op="exit")
            except Exception:
                pass
            try:
                self.p.wait(5)
            except subprocess.TimeoutExpired:
                self.kill9()
        self._log.close()
