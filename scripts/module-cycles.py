#!/usr/bin/env python3
"""Lists module cycles inside each crate; exits 1 if there is any.

A crate's top-level modules (`src/foo.rs` or `src/foo/`) form a graph: an
edge A -> B for each `crate::B` named in A's files (and `super::B` in a
top-level module file). A strongly connected component of more than one
module is a cycle: those modules cannot be read, tested or moved apart.
Comments are ignored; `pub use` re-exports at the crate root are not edges
(the root is not a module here).

    python3 scripts/module-cycles.py              # every crate under crates/
    python3 scripts/module-cycles.py crates/nbd   # just these
"""
import os
import re
import sys


def graph(crate):
    src = os.path.join(crate, "src")
    edges = {}
    for root, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            path = os.path.join(root, f)
            parts = os.path.relpath(path, src)[:-3].split(os.sep)
            if parts[-1] == "mod":
                parts = parts[:-1]
            top = "<root>" if parts in (["lib"], ["main"]) else parts[0]
            refs = edges.setdefault(top, set())
            text = re.sub(r"//.*", "", open(path, encoding="utf-8").read())
            refs.update(m.group(1) for m in re.finditer(r"crate::([a-z_0-9]+)", text))
            if len(parts) == 1:
                refs.update(m.group(1) for m in re.finditer(r"super::([a-z_0-9]+)", text))
    return {m: {t for t in refs if t in edges and t != m} for m, refs in edges.items()}


def cycles(g):
    """Tarjan's strongly connected components of more than one node."""
    index, low, stack, on, out = {}, {}, [], set(), []
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    crates = sys.argv[1:] or sorted(
        os.path.join(here, "..", "crates", c) for c in os.listdir(os.path.join(here, "..", "crates"))
    )
    found = False
    for crate in crates:
        if not os.path.isdir(os.path.join(crate, "src")):
            continue
        for comp in cycles(graph(crate)):
            found = True
            print(f"{os.path.basename(os.path.normpath(crate))}: module cycle {' <-> '.join(comp)}")
    if not found:
        print(f"module-cycles: none in {len(crates)} crates")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
