"""Which SGLang releases ``kvfence.sglang`` supports, decided by the code it relies on.

``kvfence.sglang`` wraps SGLang methods in place and calls or relies on others (the
decode's ACK tracker, the release path, the prefill's transfer worker and drain ACK). A
release is supported when *every one of those methods* is, byte for byte, the method of a
release kvfence was tested against: the digest of each method's source (its ``def`` with
its decorators, dedented; SHA-256, first 12 hex digits; ``"missing"`` where the class does
not define it) must equal that release's row in :data:`TESTED`. The version string plays
no part in the decision (it is only named in the refusal): a local build of a tested
release is accepted, an untested one is refused with the list of the methods that differ
from the closest tested release.

Each tested release has its own patch table (``decode.patches(release)``): SGLang 0.5.22
defines ``send_metadata`` on ``MooncakeKVReceiver`` (without a ``destination``
parameter), 0.5.23 on ``CommonKVReceiver``; 0.5.22's ``DecodeTransferQueue`` has no
``_is_host_destination`` (a held entry is a host one when ``enable_host_receive and
decode_req.host_staged``).

This module imports nothing from SGLang: it reads the sources (``ast``), so the table can
be made from an unpacked wheel (``python -m kvfence._sglang_hooks SITE_PACKAGES``) and
checked before the adapter imports SGLang's classes.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Dict, List, Mapping, Optional, Tuple

if TYPE_CHECKING or __package__:
    from kvfence import _hook_digest
else:  # run as a script (``python python/kvfence/<this file> SITE``): kvfence not installed
    import _hook_digest

_DISAGG = "sglang/srt/disaggregation"

#: (module file under ``sglang/srt/disaggregation/``, class, method): every SGLang method
#: ``kvfence.sglang`` wraps, calls, or whose behaviour it relies on.
HOOKS: Tuple[Tuple[str, str, str], ...] = (
    ("common/conn.py", "CommonKVReceiver", "send_metadata"),
    ("mooncake/conn.py", "MooncakeKVReceiver", "send_metadata"),
    ("common/conn.py", "CommonKVReceiver", "_send_abort_notification"),
    ("common/conn.py", "CommonKVReceiver", "ensure_abort_notified"),
    ("common/conn.py", "CommonKVReceiver", "abort"),
    ("common/conn.py", "CommonKVReceiver", "clear"),
    ("common/conn.py", "CommonKVManager", "register_deferred_abort_room"),
    ("common/conn.py", "CommonKVManager", "note_abort_ack"),
    ("common/conn.py", "CommonKVManager", "handle_abort_ack_message"),
    ("common/conn.py", "CommonKVManager", "is_abort_release_safe"),
    ("common/conn.py", "CommonKVManager", "clear_deferred_abort_state"),
    ("common/conn.py", "CommonKVManager", "_handle_node_failure"),
    ("common/conn.py", "CommonKVManager", "record_failure"),
    ("common/conn.py", "CommonKVManager", "update_status"),
    ("common/conn.py", "CommonKVManager", "_maybe_ack_drained_abort"),
    ("common/conn.py", "CommonKVManager", "_send_abort_acks"),
    ("common/conn.py", "CommonKVManager", "register_deferred_ack_target"),
    ("common/conn.py", "CommonKVManager", "poison_deferred_ack_room"),
    ("common/conn.py", "CommonKVManager", "_prefill_unique_rank"),
    ("common/conn.py", "CommonKVSender", "__init__"),
    ("common/conn.py", "CommonKVSender", "clear"),
    ("common/conn.py", "CommonKVSender", "abort"),
    ("common/utils.py", "FastQueue", "get"),
    ("mooncake/conn.py", "MooncakeKVManager", "transfer_worker"),
    ("mooncake/conn.py", "MooncakeKVManager", "_poison_unsettled_send"),
    ("mooncake/conn.py", "MooncakeKVManager", "_handle_abort_notification"),
    ("decode.py", "DecodeTransferQueue", "resolve_deferred_releases"),
    ("decode.py", "DecodeTransferQueue", "pop_transferred"),
    ("decode.py", "DecodeTransferQueue", "_defer_release"),
    ("decode.py", "DecodeTransferQueue", "_do_release"),
    ("decode.py", "DecodeTransferQueue", "release_memory_occupation"),
    ("decode.py", "DecodeTransferQueue", "_is_host_destination"),
    # the transport reset (kvfence.sglang.reset, KVFENCE_SGLANG_RESET)
    ("common/conn.py", "CommonKVReceiver", "_setup_bootstrap_infos"),
    ("mooncake/conn.py", "MooncakeKVManager", "get_session_id"),
    ("mooncake/conn.py", "MooncakeKVManager", "build_receiver_registration_message"),
    ("mooncake/conn.py", "MooncakeKVManager", "build_receiver_metadata_message"),
    ("mooncake/conn.py", "MooncakeKVManager", "_registerable_regions"),
    ("common/conn.py", "CommonKVManager", "apply_prefill_status"),
    ("common/conn.py", "CommonKVManager", "_encode_kv_status_message"),
    ("common/conn.py", "CommonKVManager", "parse_kv_status_message"),
    ("common/conn.py", "CommonKVManager", "_send_multipart_locked"),
    ("common/conn.py", "CommonKVManager", "_room_notify_targets"),
)

#: The releases kvfence was tested against: release -> the digest of each hook (in
#: :data:`HOOKS` order). Made with ``python -m kvfence._sglang_hooks`` on each release's
#: site-packages; ``e2e/sglang/ci.sh`` checks that each environment matches its row.
TESTED: Dict[str, Tuple[str, ...]] = {
    "0.5.22": (
        "ef54c54ec0fd", "b144c9c23c7e", "b096d37023df", "928d1c998aa3", "e18d207ee461",
        "74c161d28eb9", "9891b8c45839", "a15176d9bce6", "db1f252ed058", "f85324218743",
        "46b0c2767f42", "758e288e8c48", "8b20ba0e9f93", "a5edfc22b41c", "182dff5121d8",
        "6d8de9a9717e", "037dd50a0dcd", "557f0209a81d", "47598697af2e", "be4e66ab2330",
        "39e309e861a7", "40e8c78b2bb6", "cd8544785d21", "342067ffd1b5", "a9ae6c3f2e18",
        "4fee508280a4", "264087073eef", "f6e5bd05c6fb", "2a3d239c0bc0", "616fee555f8d",
        "85d03764adb3", "missing", "4f6f92789dff", "e189616d8fa3", "missing", "missing",
        "1408ca017bd9", "c7e0ae865a3a", "77d2423d1613",
        "c1eeaee3ddbf", "c01260341f50", "f200840ac1ed",
    ),
    "0.5.23": (
        "938def6fade3", "missing", "b096d37023df", "928d1c998aa3", "a4fbc4dfe8cf",
        "74c161d28eb9", "9891b8c45839", "a15176d9bce6", "db1f252ed058", "f85324218743",
        "46b0c2767f42", "c07ccb11aad7", "8b20ba0e9f93", "a5edfc22b41c", "182dff5121d8",
        "6d8de9a9717e", "037dd50a0dcd", "557f0209a81d", "47598697af2e", "dbe228b2a27f",
        "01c22eeaef89", "623e05d628b0", "cd8544785d21", "8345ae76f0a5", "a9ae6c3f2e18",
        "4fee508280a4", "c6ae3e5fb7ae", "9f2df2dae63d", "6106654ea4d9", "b8d18695d2ed",
        "85d03764adb3", "bf446c3aaccd", "4f6f92789dff", "e189616d8fa3", "6ed74e785228",
        "541d12142b6f", "1408ca017bd9", "55cef5ae6d24", "77d2423d1613",
        "c1eeaee3ddbf", "c01260341f50", "f200840ac1ed",
    ),
}


def digests(root: str) -> Tuple[str, ...]:
    """The digest of each hook of the SGLang whose package directory is ``root/sglang``
    (``"missing"`` for a hook not found)."""
    return _hook_digest.digests(root, _DISAGG, HOOKS)


def installed_root() -> Optional[str]:
    """The directory that holds the importable ``sglang`` package (None: not installed).
    Found without importing SGLang."""
    import importlib.util

    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.dirname(list(spec.submodule_search_locations)[0])


def match(found: Tuple[str, ...], tested: Mapping[str, Tuple[str, ...]] = TESTED
          ) -> Tuple[Optional[str], List[str]]:
    """The tested release whose every hook has the digest found (or None), and, if none,
    the hooks that differ from the closest tested release."""
    return _hook_digest.match(found, tested, HOOKS)


def supported_range() -> str:
    """The tested releases, as the refusal names them ("0.5.22 - 0.5.23")."""
    rels = sorted(TESTED, key=lambda v: tuple(int(x) for x in v.split(".")))
    return rels[0] if len(rels) == 1 else "%s - %s" % (rels[0], rels[-1])


def main(argv: List[str]) -> int:
    """Prints the TESTED row of the SGLang under each root given (site-packages paths)."""
    _hook_digest.print_rows(argv[1:], _DISAGG, HOOKS)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
