"""The harness's control directory of a pair (``CTL``), shared by the SGLang and vLLM pairs.

The servers' start-up hooks (``sglang_site``, ``vllm_site``) read and write small files in
it: the harness creates one to ask for something (``hold_next``, ``release``, ...), the hook
answers with another (``held``, ``held_done``, ...). Test-side only.
"""

from __future__ import annotations

import os
import time


class CtlDir:
    """Files of the control directory ``self.ctl`` (a path, set by the pair)."""

    ctl: str

    def touch(self, name: str) -> None:
        """Creates ``CTL/name`` (empty)."""
        open(os.path.join(self.ctl, name), "w").close()

    def remove(self, name: str) -> None:
        """Removes ``CTL/name`` if it is there."""
        try:
            os.unlink(os.path.join(self.ctl, name))
        except FileNotFoundError:
            pass

    def has(self, name: str) -> bool:
        """Whether ``CTL/name`` exists."""
        return os.path.exists(os.path.join(self.ctl, name))

    def read_ctl(self, name: str) -> "str | None":
        """The text of ``CTL/name`` (None if absent)."""
        try:
            with open(os.path.join(self.ctl, name)) as f:
                return f.read()
        except FileNotFoundError:
            return None

    def wait_ctl(self, name: str, timeout: float) -> bool:
        """Polls until ``CTL/name`` exists (True) or ``timeout`` s passed (False)."""
        t0 = time.time()
        while time.time() - t0 < timeout:
            if self.has(name):
                return True
            time.sleep(0.05)
        return False
