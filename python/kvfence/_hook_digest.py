"""The digest of an engine's methods, read from its sources: what decides which engine
releases an adapter supports (:mod:`kvfence._vllm_hooks`, :mod:`kvfence._sglang_hooks`).

A hook is ``(module file, class, method)`` under one package directory of the engine. Its
digest is the SHA-256 (first 12 hex digits) of the method's source: its ``def`` with its
decorators, dedented; ``"missing"`` where the class does not define it. Nothing of the
engine is imported: the sources are parsed (``ast``), so a table can be made from an
unpacked wheel and checked before an adapter imports the engine's classes.

This module imports nothing of kvfence either: the two hook tables also run as plain
scripts (``python python/kvfence/_vllm_hooks.py SITE_PACKAGES``) where kvfence is not
installed, and then import it by its file name.
"""

from __future__ import annotations

import ast
import hashlib
import os
import textwrap
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

#: (module file under the engine's package directory, class, method)
Hook = Tuple[str, str, str]


def method_source(tree: ast.Module, lines: List[str], cls: str, name: str) -> Optional[str]:
    """The dedented source of ``cls.name`` (decorators included) in a parsed module, or
    None if the class does not define it."""
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == name:
                    first = min([d.lineno for d in item.decorator_list] + [item.lineno])
                    end = item.end_lineno or item.lineno
                    return textwrap.dedent("".join(lines[first - 1 : end]))
    return None


def digests(root: str, package_dir: str, hooks: Sequence[Hook]) -> Tuple[str, ...]:
    """The digest of each hook (in order) of the engine whose modules are under
    ``root/package_dir`` (``"missing"`` for a hook not found, or a file not readable)."""
    out: List[str] = []
    parsed: Dict[str, Tuple[ast.Module, List[str]]] = {}
    for fname, cls, name in hooks:
        if fname not in parsed:
            try:
                with open(os.path.join(root, package_dir, fname), encoding="utf-8") as f:
                    text = f.read()
            except OSError:
                parsed[fname] = (ast.Module(body=[], type_ignores=[]), [])
            else:
                parsed[fname] = (ast.parse(text), text.splitlines(keepends=True))
        tree, lines = parsed[fname]
        src = method_source(tree, lines, cls, name)
        out.append("missing" if src is None else hashlib.sha256(src.encode()).hexdigest()[:12])
    return tuple(out)


def match(
    found: Tuple[str, ...], tested: Mapping[str, Tuple[str, ...]], hooks: Sequence[Hook]
) -> Tuple[Optional[str], List[str]]:
    """The tested release whose every hook has the digest found (or None), and, if none,
    the hooks (``Class.method``) that differ from the closest tested release."""
    best_diff: List[str] = [f"{c}.{n}" for _, c, n in hooks]
    for release, want in tested.items():
        diff = [f"{c}.{n}" for (_, c, n), a, b in zip(hooks, found, want) if a != b]
        if not diff:
            return release, []
        if len(diff) < len(best_diff):
            best_diff = diff
    return None, best_diff


def print_rows(roots: Sequence[str], package_dir: str, hooks: Sequence[Hook]) -> None:
    """Prints the ``TESTED`` row of the engine under each root (site-packages paths)."""
    for root in roots:
        print(f"    # {root}")
        print("    (" + ", ".join(f'"{d}"' for d in digests(root, package_dir, hooks)) + "),")
