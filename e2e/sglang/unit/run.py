"""SGLang's own unit tests of the deferred KV release, stock and under kvfence.sglang.

    e2e/sglang/unit/run.py [--python VENV_PYTHON]

The two test files (sgl-project/sglang, ``test/registered/unit/disaggregation/``
``test_deferred_decode_kv_release.py`` and ``test_mooncake_deferred_kv_release.py``) are
not in any package (the 0.5.23 wheel has no tests; PyPI's sglang sdists stop at
0.5.10.post1), so they are fetched at run time into ``e2e/sglang/.upstream/`` (git-ignored,
never committed; see e2e/sglang/README.md). Without them: a NOTICE and exit 77.

Each file runs twice under pytest: ``KVFENCE_SGLANG=0`` (stock 0.5.23) and
``KVFENCE_SGLANG=1`` (the start-up hook installs kvfence.sglang). Expected:

* stock: everything passes but ``NEWER_THAN_0_5_23`` (the test expects behaviour SGLang
  added after 0.5.23);
* kvfence: everything that passes on stock passes, except ``DEMAND_TIMEOUT_RELEASE``,
  which must *fail*: they demand that a held room be released on its deadline with no ACK,
  which kvfence refuses by design.

Prints PASS/FAIL lines and ``N passed, M failed``; exit 1 on a failed check.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from typing import Dict, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
UPSTREAM = os.environ.get("SGLANG_UNIT_TESTS", os.path.join(os.path.dirname(HERE), ".upstream"))
FILES = {
    # The versions this was checked with (sha256 of the files as fetched).
    "test_deferred_decode_kv_release.py":
        "229126a6e27cf082cf4db46820fe7b12ba3829a94335b0a55c9d11aefc89f8d2",
    "test_mooncake_deferred_kv_release.py":
        "a3eec97f557d7a3690af5c5dc70d991bbf54ad763b898514ec2622112e5fa08c",
}
DEMAND_TIMEOUT_RELEASE = {
    "TestResolveDeferredReleases::test_releases_on_timeout_without_ack":
        "a held room with no ACK, past its deadline, must be released (release_kv_cache "
        "called): kvfence never releases on time",
    "TestResolveDeferredReleases::test_metrics_disabled_does_not_observe_release":
        "the same release on an expired deadline, with metrics off",
    "TestResolveDeferredReleases::test_failed_release_is_isolated_and_not_retried":
        "two rooms past their deadline with no ACK must both be released (one release "
        "raising); kvfence holds both",
}
NEWER_THAN_0_5_23 = {
    "TestMooncakeAbortNotification::test_generationless_abort_warns_and_falls_back_to_timeout":
        "expects logger.warning_once for a generation-less ABORT; 0.5.23 logs it at debug",
}


GATES: Dict[str, str] = {}  # rule -> the conftest's "kvfence gates attached" line


def run(python: str, rule: str, out: str) -> Dict[str, str]:
    env = dict(os.environ, KVFENCE_SGLANG="1" if rule == "kvfence" else "0")
    xml = os.path.join(out, "%s.xml" % rule)
    cmd = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", HERE,
           "-c", os.devnull, "--confcutdir", HERE, "-p", "conftest", "--junitxml", xml, UPSTREAM]
    p = subprocess.run(cmd, cwd=HERE, env=env, capture_output=True, text=True)
    sys.stderr.write(p.stdout[-3000:] if p.returncode not in (0, 1) else "")
    for line in p.stdout.splitlines():
        if line.startswith("kvfence gates attached:"):
            GATES[rule] = line
    results: Dict[str, str] = {}
    if not os.path.exists(xml):
        raise RuntimeError("pytest (%s) wrote no report (exit %d):\n%s%s" % (
            rule, p.returncode, p.stdout[-3000:], p.stderr[-3000:]))
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = "%s::%s" % (case.get("classname", "").split(".")[-1], case.get("name"))
        state = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                state = "failed"
            elif child.tag == "skipped":
                state = "skipped"
        results[name] = state
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--python", default=sys.executable)
    args = ap.parse_args()
    missing = [f for f in FILES if not os.path.exists(os.path.join(UPSTREAM, f))]
    if missing:
        print("NOTICE: SGLang's unit tests are not here (%s): they are in no package "
              "registry; fetch them into %s (e2e/sglang/README.md)" % (", ".join(missing), UPSTREAM))
        return 77
    for f in FILES:
        with open(os.path.join(UPSTREAM, f), "rb") as fh:
            digest = hashlib.sha256(fh.read()).hexdigest()
        print("using %s (sha256 %s%s)" % (f, digest[:16], "" if digest == FILES[f]
              else "; NOT the version this was checked with: results may differ"))
    out = tempfile.mkdtemp(prefix="kvfence-sglang-unit-")
    stock, kv = run(args.python, "stock", out), run(args.python, "kvfence", out)
    passed = failed = 0

    def check(name: str, ok: bool, detail: str = "") -> None:
        nonlocal passed, failed
        print(("PASS " if ok else "FAIL ") + name + (" (%s)" % detail if detail else ""))
        if ok:
            passed += 1
        else:
            failed += 1

    check("tests collected", len(stock) >= 40 and set(stock) == set(kv),
          "%d stock, %d kvfence" % (len(stock), len(kv)))
    for name in sorted(stock):
        s, k = stock[name], kv.get(name)
        if name in NEWER_THAN_0_5_23:
            print("SKIP %s: %s (stock: %s, kvfence: %s)" % (name, NEWER_THAN_0_5_23[name], s, k))
            continue
        if name in DEMAND_TIMEOUT_RELEASE:
            check("stock passes %s" % name, s == "passed", s)
            check("kvfence fails %s (by design: %s)" % (name, DEMAND_TIMEOUT_RELEASE[name]),
                  k == "failed", k or "missing")
            continue
        check("stock passes %s" % name, s == "passed", s)
        check("kvfence passes %s" % name, k == "passed", k or "missing")
    summary: Tuple[int, int] = (
        sum(v == "passed" for v in stock.values()), sum(v == "passed" for v in kv.values()))
    print("SGLang unit tests: stock %d/%d passed, kvfence %d/%d passed" % (
        summary[0], len(stock), summary[1], len(kv)))
    gates = GATES.get("kvfence", "kvfence gates attached: not reported")
    print("under kvfence, %s" % gates)
    # SGLang's tests build managers with __new__: without the gate's attachment at first
    # use every kvfence wrapper took its "no gate" branch and the kvfence run said nothing.
    check("SGLang's tests ran with kvfence gates attached", gates.startswith(
        "kvfence gates attached:") and "(at first use 0)" not in gates, gates)
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
