#!/usr/bin/env python3
"""The op table's slots, each in every backend: a text-level check (CI builds no CUDA).

core/backend/ops.h declares struct fp4rl_ops once; each backend fills it with designated
initialisers (core/cpu/ops_table.c, cuda/ops_table.cu). A slot left out of a table compiles (it
is NULL) and fails only when the op is called, on that backend; a CUDA table is not compiled at
all where there is no CUDA toolkit. So this checks, for every table: each slot of the header is
named exactly once, by the op of its name (fp4rl_<backend>_<slot>), nothing else is, and, in a C++ table (.cu), in the header's order (C++20's
rule for designated initialisers, which nvcc enforces; C takes any order). It also checks that the parity suite (tests/test_ops_parity.c)
calls every slot, so a new op is compared against the CPU reference on the GPU.
tests/test_ops_table.c checks at run time that no slot of the CPU table is NULL.

Usage: check_ops_tables.py [repo root]; exit 0 when all hold, 1 with a list of what does not.
"""
import re
import sys
from pathlib import Path

HEADER = "core/backend/ops.h"
TABLES = ["core/cpu/ops_table.c", "cuda/ops_table.cu"]
PARITY = "tests/test_ops_parity.c"


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def header_slots(root):
    text = strip_comments((root / HEADER).read_text())
    m = re.search(r"typedef\s+struct\s+fp4rl_ops\s*\{(.*?)\}\s*fp4rl_ops\s*;", text, flags=re.S)
    if not m:
        sys.exit(f"{HEADER}: no 'typedef struct fp4rl_ops {{ ... }} fp4rl_ops;'")
    body = m.group(1)
    slots = re.findall(r"\(\s*\*\s*(\w+)\s*\)\s*\(", body)
    # every member is `name` or a function pointer: anything else would be missed above
    members = [s.strip() for s in body.split(";") if s.strip()]
    others = [re.sub(r"\s+", " ", s) for s in members if not re.search(r"\(\s*\*\s*\w+\s*\)\s*\(", s)]
    if others != ["const char *name"]:
        sys.exit(f"{HEADER}: struct fp4rl_ops has members other than `name` and function pointers: {others}")
    return ["name"] + slots


def table_fields(path):
    text = strip_comments(path.read_text())
    m = re.search(r"fp4rl_ops\s+\w+\s*=\s*\{(.*?)\}\s*;", text, flags=re.S)
    if not m:
        return None
    return re.findall(r"\.\s*(\w+)\s*=\s*([^,]+?)\s*(?:,|$)", m.group(1).strip())


def main():
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent)
    slots = header_slots(root)
    problems = []
    for rel in TABLES:
        path = root / rel
        if not path.exists():
            problems.append(f"{rel}: missing")
            continue
        pairs = table_fields(path)
        if pairs is None:
            problems.append(f"{rel}: no `fp4rl_ops <name> = {{ ... }};` table")
            continue
        fields = [f for f, _ in pairs]
        # each op is fp4rl_<backend>_<slot>: a slot holding another op of the same type compiles
        crossed = [f"{f} = {v}" for f, v in pairs if f != "name" and not re.fullmatch(r"fp4rl_\w+?_" + f, v)]
        if crossed:
            problems.append(f"{rel}: slots holding an op of another name: {', '.join(crossed)}")
        missing = [s for s in slots if s not in fields]
        unknown = [f for f in fields if f not in slots]
        twice = sorted({f for f in fields if fields.count(f) > 1})
        if missing:
            problems.append(f"{rel}: slots of {HEADER} not filled: {', '.join(missing)}")
        if unknown:
            problems.append(f"{rel}: names no slot of {HEADER}: {', '.join(unknown)}")
        if twice:
            problems.append(f"{rel}: slots named twice: {', '.join(twice)}")
        known = [f for f in fields if f in slots]
        order = [s for s in slots if s in known]
        if rel.endswith(".cu") and not twice and known != order:
            at = next(i for i, (a, b) in enumerate(zip(known, order)) if a != b)
            problems.append(f"{rel}: slots out of the header's order from .{known[at]} (expected .{order[at]})")
    parity = root / PARITY
    if parity.exists():
        text = strip_comments(parity.read_text())
        unused = [s for s in slots[1:] if not re.search(r"->\s*" + s + r"\s*\(", text)]
        if unused:
            problems.append(f"{PARITY}: slots the parity suite never calls: {', '.join(unused)}")
    else:
        problems.append(f"{PARITY}: missing")
    if problems:
        print("\n".join(problems))
        return 1
    print(f"ok: {len(slots) - 1} op slots, filled in {' and '.join(TABLES)} (.cu in the header's order), all called by {PARITY}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
