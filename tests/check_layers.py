#!/usr/bin/env python3
"""The layers of core/ as the README states them: every #include "..." of a file in core/ or cuda/
names a folder its own folder may include, and no header includes itself back through others.
Usage: check_layers.py REPO_ROOT  (exit 1 with the offending lines)."""
import os
import re
import sys

# folder -> the folders its files may include (besides itself). Lower layers first.
ALLOWED = {
    "format": set(),
    "runtime": {"format"},
    "io": {"runtime", "format"},
    "tensor": {"runtime", "format"},
    "backend": {"tensor", "runtime", "format"},
    "cpu": {"backend", "tensor", "runtime", "format"},
    "cuda": {"backend", "tensor", "runtime", "format"},
    "model": {"backend", "tensor", "io", "runtime", "format"},
    "rl": {"model", "backend", "tensor", "io", "runtime", "format"},
}
# the context picks a backend at creation: the one file below the backends that names them
EXCEPTIONS = {("runtime/context.c", "backend"), ("runtime/context.c", "cpu")}
INC = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def main(root):
    bad, graph = [], {}
    for top in ("core", "cuda"):
        for d, _, files in os.walk(os.path.join(root, top)):
            for f in files:
                if not f.endswith((".c", ".h", ".cu", ".cuh")):
                    continue
                path = os.path.join(d, f)
                rel = os.path.relpath(path, os.path.join(root, "core" if top == "core" else ""))
                folder = rel.split(os.sep)[0]
                text = open(path, encoding="utf-8").read()
                for inc in INC.findall(text):
                    if inc.startswith("fp4rl/"):
                        continue  # the public header
                    if "/" not in inc:
                        target = folder  # a sibling in the same folder
                        key = os.path.join(folder, inc)
                    else:
                        target = inc.split("/")[0]
                        key = inc
                    graph.setdefault(rel, set()).add(key)
                    if target != folder and target not in ALLOWED[folder] and (rel, target) not in EXCEPTIONS:
                        bad.append(f"{top}/{rel} includes \"{inc}\": {folder}/ may include {sorted(ALLOWED[folder]) or 'nothing'}")
    # include circles among headers
    def visit(n, stack, seen):
        for m in graph.get(n, ()):
            if m in stack:
                bad.append("include circle: " + " -> ".join(stack[stack.index(m):] + [m]))
            elif m not in seen:
                seen.add(m)
                visit(m, stack + [m], seen)
    for n in list(graph):
        visit(n, [n], {n})
    for b in sorted(set(bad)):
        print(b)
    print(f"check_layers: {len(graph)} files, {sum(map(len, graph.values()))} includes, {len(set(bad))} problems")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
