#!/usr/bin/env python3
"""The import graph of stagefs's src/, file by file: cycles and upward imports.

Run from the repository root (or anywhere: paths are taken from this
script's place):

    python3 scripts/import-graph.py            # cycles and upward imports
    python3 scripts/import-graph.py --edges    # also every edge, "from -> to"
    python3 scripts/import-graph.py --tests    # count #[cfg(test)] code too

Each `.rs` file under src/ is one node (`src/a/mod.rs` and `src/a.rs` are
the module `a`, `src/a/b.rs` is `a::b`). An edge A -> B means that file A
names an item of module B: a `use crate::…`, `use super::…`, `use self::…`
or `use child::…` declaration (use trees with braces included), or a path
`crate::b::…` / `super::…` written in the code. A path resolves to the
deepest module that is a file (`crate::catalog::tree::Tree` ->
src/catalog/tree.rs, `crate::catalog::Catalog` -> src/catalog/mod.rs).
Comments, strings and `#[cfg(test)]` items are skipped unless `--tests`.

A name that a module re-exports (`pub use part::Thing;` in `a/mod.rs`)
resolves to the file that defines it, so `crate::a::Thing` is an edge to
`a/part.rs`.

Edges to the crate root are left out (src/lib.rs holds only `mod` lines),
and so are edges between a file and the files of its own module tree
(`a/mod.rs` using its parts, a part naming its parent's error type):
a module and its parts are one room. Edges between sibling parts, and
every edge leaving a module, count.

Reports:
- import cycles: strongly connected components of more than one file,
  each with the edges that hold it together;
- upward imports: an edge from a file of a lower layer to a file of a
  higher one, by LAYERS below (the data flow of src/lib.rs's doc, with the
  foundations under it and the commands on top). A file's layer is that of
  the longest LAYERS entry its module path starts with.

Exits 1 when there is a cycle (upward imports are reported, not fatal),
2 on a usage error.
"""
import os
import re
import sys
from collections import defaultdict

# Lowest first: a module may import from its own layer and the layers
# below. The data flow of src/lib.rs's doc read as dependencies: the
# pipeline's types (events, catalog trees, the status board) under the
# store and the sources that validate against them, the journal of what
# they accepted, the threads that wire them, the commands on top.
LAYERS = [
    ["durable", "redact", "fusermount", "mount_helper"],
    ["event", "state_lock", "latency"],
    ["catalog"],
    ["status"],
    ["source_file"],
    ["stage"],
    ["source"],
    ["journal"],
    ["checkpoint"],
    ["bootstrap"],
    ["view"],
    ["fuse"],
    ["replicate"],
    # Publishing states to shared storage (reads catalog trees and the
    # blob store's paths through closures the daemon hands it).
    ["publish"],
    # A reader host: published states into a catalog and a view.
    ["follow"],
    ["metrics"],
    ["daemon", "run"],
    ["testkit", "checker", "workload", "hive_writer"],
    ["demo", "check"],
    # The command line (its flags name defaults from the layers below) and
    # the config file read as that command line.
    ["cli", "config"],
]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "src")


def module_of(rel):
    """Module path (tuple) of a file path relative to src/."""
    parts = rel[:-3].split(os.sep)
    if parts[-1] in ("mod", "lib"):
        parts = parts[:-1]
    if parts == ["main"]:
        return ("<main>",)
    return tuple(parts)


def strip_code(text):
    """Text with comments, string and char literals blanked (newlines kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            i = j
            continue
        if text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
            continue
        m = re.match(r'b?r(#*)"', text[i:i + 260])
        if m and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            end = '"' + m.group(1)
            j = text.find(end, i + m.end())
            j = n if j < 0 else j + len(end)
            out.append('""' + re.sub(r"[^\n]", " ", text[i + 2:j]))
            i = j
            continue
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j += 1
            out.append('""' + re.sub(r"[^\n]", " ", text[i + 2:j]))
            i = j
            continue
        if c == "'":
            m = re.match(r"'(\\.[^']*|[^\\'])'", text[i:i + 12])
            if m:
                out.append("' '" + " " * (m.end() - 3))
                i += m.end()
                continue
        out.append(c)
        i += 1
    return "".join(out)


def drop_test_items(code):
    """Blank every item under #[cfg(test)] (a block or a `mod x;` line)."""
    out = list(code)
    for m in re.finditer(r"#\[cfg\(test\)\]", code):
        j = m.end()
        # the item ends at its first `;` before any `{`, or at the `}`
        # closing its first `{`.
        depth = 0
        k = j
        while k < len(code):
            ch = code[k]
            if ch == ";" and depth == 0:
                break
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    break
            k += 1
        for p in range(m.start(), min(k + 1, len(code))):
            if out[p] != "\n":
                out[p] = " "
    return "".join(out)


def split_top(s):
    """Split a use-tree list on commas not inside braces."""
    parts, depth, cur = [], 0, []
    for ch in s:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def expand_use(tree, prefix=()):
    """All paths (tuples of segments) named by a use tree."""
    tree = re.sub(r"\s+as\s+\w+", "", tree)
    tree = re.sub(r"\s+", "", tree)
    if "{" not in tree:
        path = tuple(p for p in tree.split("::") if p)
        return [prefix + path]
    head, _, rest = tree.partition("{")
    body = rest[: rest.rfind("}")]
    head_path = tuple(p for p in head.split("::") if p)
    paths = []
    for sub in split_top(body):
        paths.extend(expand_use(sub, prefix + head_path))
    return paths


USE_RE = re.compile(r"\buse\s+([^;]+);")
PUB_USE_RE = re.compile(r"\bpub(?:\([\w:\s]+\))?\s+use\s+([^;]+);")
INLINE_RE = re.compile(r"(?<![\w:])((?:crate|super|self)(?:::(?:super|\w+))+)")


def resolve(mod, path, modules, children, reexports, depth=0):
    """File module a path names from module `mod`, or None (outside the crate)."""
    if not path:
        return None
    first = path[0]
    if first == "crate":
        base, rest = (), path[1:]
    elif first in ("super", "self"):
        base = mod
        rest = path
        while rest and rest[0] in ("super", "self"):
            if rest[0] == "super":
                base = base[:-1]
            rest = rest[1:]
    elif first in children.get(mod, ()):
        base, rest = mod, path
    else:
        return None  # an external crate, std, or a local name
    best = base
    cur = base
    for seg in rest:
        cur = cur + (seg,)
        if cur in modules:
            best = cur
        else:
            again = reexports.get((best, seg))
            if again is not None and depth < 8:
                found = resolve(best, again, modules, children, reexports, depth + 1)
                if found is not None:
                    return found
            break
    return best


def tarjan(nodes, edges):
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
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
            out.append(comp)

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def same_room(a, b):
    """Whether one of two modules lies inside the other (or they are one)."""
    return a[: len(b)] == b or b[: len(a)] == a


def layer_of(mod):
    best, best_len = None, -1
    for i, names in enumerate(LAYERS):
        for name in names:
            parts = tuple(name.split("::"))
            if mod[: len(parts)] == parts and len(parts) > best_len:
                best, best_len = i, len(parts)
    return best


def main(argv):
    show_edges = "--edges" in argv
    with_tests = "--tests" in argv
    unknown = [a for a in argv if a not in ("--edges", "--tests")]
    if unknown:
        print(f"unknown argument(s): {' '.join(unknown)}\n", file=sys.stderr)
        print(__doc__, file=sys.stderr)
        return 2

    files = {}
    for dirpath, _, names in os.walk(SRC):
        for name in names:
            if name.endswith(".rs"):
                rel = os.path.relpath(os.path.join(dirpath, name), SRC)
                files[module_of(rel)] = "src/" + rel.replace(os.sep, "/")
    modules = set(files)
    children = defaultdict(set)
    for m in modules:
        if len(m) > 0 and m != ("<main>",):
            children[m[:-1]].add(m[-1])

    codes = {}
    reexports = {}  # (module, name) -> path it re-exports
    for mod, rel in sorted(files.items()):
        with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
            code = strip_code(f.read())
        if not with_tests:
            code = drop_test_items(code)
        codes[mod] = code
        for m in PUB_USE_RE.finditer(code):
            for path in expand_use(m.group(1)):
                if path and path[-1] not in ("*", "self"):
                    reexports[(mod, path[-1])] = path

    edges = defaultdict(set)
    where = {}
    for mod, code in sorted(codes.items()):
        paths = []
        for m in USE_RE.finditer(code):
            tree = m.group(1).strip()
            if tree.startswith("::"):
                continue
            paths.extend(expand_use(tree))
        for m in INLINE_RE.finditer(code):
            paths.append(tuple(m.group(1).split("::")))
        for path in paths:
            target = resolve(mod, path, modules, children, reexports)
            if target is None or target == () or same_room(mod, target):
                continue
            if mod == ("<main>",) or target == ("<main>",):
                continue
            edges[mod].add(target)
            shown = path[:-1] if path[-1] == "self" else path
            where.setdefault((mod, target), "::".join(shown))

    name = files.__getitem__
    sccs = []
    for comp in tarjan(modules, edges):
        if len(comp) > 1:
            inside = set(comp)
            held = [(a, b) for a in sorted(comp) for b in sorted(edges[a]) if b in inside]
            sccs.append((sorted(comp), held))
    sccs.sort()

    unlayered = sorted(m for m in modules if m not in ((), ("<main>",)) and layer_of(m) is None)
    upward = []
    for a in sorted(edges):
        for b in sorted(edges[a]):
            la, lb = layer_of(a), layer_of(b)
            if la is not None and lb is not None and lb > la:
                upward.append((a, b))

    if show_edges:
        print(f"edges ({sum(len(v) for v in edges.values())}):")
        for a in sorted(edges):
            for b in sorted(edges[a]):
                print(f"  {name(a)} -> {name(b)}   ({where[(a, b)]})")
        print()

    print(f"import cycles: {len(sccs)}")
    for comp, between in sccs:
        print(f"  {len(comp)} files: {', '.join(name(m) for m in comp)}")
        for a, b in between:
            print(f"    {name(a)} -> {name(b)}   ({where[(a, b)]})")
    print(f"upward imports: {len(upward)}")
    for a, b in upward:
        print(f"  {name(a)} -> {name(b)}   ({where[(a, b)]})")
    if unlayered:
        print("modules missing from LAYERS: " + ", ".join(name(m) for m in unlayered))
    return 1 if sccs else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
