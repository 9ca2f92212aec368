#!/usr/bin/env python3
"""The op table is declared once and every backend fills all of it: a text-level check (CI builds no CUDA).

core/backend/ops_list.h lists the ops, FP4RL_OP(return type, name, (parameters)) each. From it
come struct fp4rl_ops's slots (core/backend/ops.h), the backends' prototypes (fp4rl_<backend>_<op>
in core/cpu/ops_cpu.h, cuda/ops_cuda.h) and both tables (core/cpu/ops_table.c, cuda/ops_table.cu).
This checks that each of those files is generated from the list and holds nothing written by
hand beside it (a hand-written slot, prototype or table entry is what could drift, or put one op
in another's slot), that the list names each op once, that every backend defines every op (a CUDA
backend is not linked where there is no CUDA toolkit), and that the parity suite
(tests/test_ops_parity.c) calls every op, so a new op is compared against the CPU reference on the
GPU. tests/test_ops_table.c checks the compiled CPU table: its size and every slot by name.

Usage: check_ops_tables.py [repo root]; exit 0 when all hold, 1 with a list of what does not.
"""
import re
import sys
from pathlib import Path

LIST = "core/backend/ops_list.h"
HEADER = "core/backend/ops.h"
# backend -> (its prototypes header, its table, the glob of the sources defining its ops)
BACKENDS = {
    "cpu": ("core/cpu/ops_cpu.h", "core/cpu/ops_table.c", "core/cpu/*.c"),
    "cuda": ("cuda/ops_cuda.h", "cuda/ops_table.cu", "cuda/*.cu"),
}
PARITY = "tests/test_ops_parity.c"
INCLUDE_LIST = r'#\s*include\s+"backend/ops_list\.h"'


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def list_ops(root, problems):
    text = strip_comments((root / LIST).read_text())
    lines = [l for l in text.splitlines() if not l.lstrip().startswith("#")]
    ops = re.findall(r"\bFP4RL_OP\(\s*[^,()]+?\s*,\s*(\w+)\s*,\s*\(", "\n".join(lines))
    if not ops:
        sys.exit(f"{LIST}: no FP4RL_OP(ret, name, (params)) entries")
    twice = sorted({o for o in ops if ops.count(o) > 1})
    if twice:
        problems.append(f"{LIST}: ops listed twice: {', '.join(twice)}")
    return ops


def expands(text, define):
    """Whether text defines FP4RL_OP as `define` (whitespace-insensitive) and then includes the list."""
    pat = r"#\s*define\s+FP4RL_OP\(\s*ret\s*,\s*op\s*,\s*params\s*\)\s*" + r"\s*".join(map(re.escape, define.split()))
    return re.search(pat + r"\s*" + INCLUDE_LIST, text) is not None


def check_struct(root, problems):
    text = strip_comments((root / HEADER).read_text())
    m = re.search(r"typedef\s+struct\s+fp4rl_ops\s*\{(.*?)\}\s*fp4rl_ops\s*;", text, flags=re.S)
    if not m:
        sys.exit(f"{HEADER}: no 'typedef struct fp4rl_ops {{ ... }} fp4rl_ops;'")
    body = re.sub(r"\s+", " ", m.group(1)).strip()
    want = 'const char *name; #define FP4RL_OP(ret, op, params) ret(*op) params; #include "backend/ops_list.h"'
    if body != want:
        problems.append(f"{HEADER}: struct fp4rl_ops must be `name` and the slots of {LIST} only; it is: {body}")


def check_backend(root, be, header, table, sources, ops, problems):
    h = strip_comments((root / header).read_text())
    if not expands(h, f"ret fp4rl_{be}_##op params;") and not expands(h, f"FP4RL_HIDDEN ret fp4rl_{be}_##op params;"):
        problems.append(f"{header}: does not declare fp4rl_{be}_<op> from {LIST}")
    for op in ops:  # a prototype written by hand beside the generated one
        if re.search(r"\bfp4rl_" + be + "_" + op + r"\s*\(", h):
            problems.append(f"{header}: declares fp4rl_{be}_{op} by hand (it comes from {LIST})")
    t = strip_comments((root / table).read_text())
    m = re.search(r"fp4rl_ops\s+fp4rl_" + be + r"_ops\s*=\s*\{(.*?)\}\s*;", t, flags=re.S)
    if not m:
        problems.append(f"{table}: no `fp4rl_ops fp4rl_{be}_ops = {{ ... }};` table")
    else:
        body = re.sub(r"\s+", " ", m.group(1)).strip()
        want = f'.name = "{be}", #define FP4RL_OP(ret, op, params) .op = fp4rl_{be}_##op, #include "backend/ops_list.h"'
        if body != want:
            problems.append(f"{table}: the table must be .name and {LIST}'s entries (.op = fp4rl_{be}_##op) only; it is: {body}")
    code = "\n".join(strip_comments(p.read_text()) for p in sorted(root.glob(sources)))
    undefined = [op for op in ops if not re.search(r"\bfp4rl_status\s+fp4rl_" + be + "_" + op + r"\s*\([^;{]*\)\s*\{", code)]
    if undefined:
        problems.append(f"{sources}: no definition of: {', '.join(f'fp4rl_{be}_{o}' for o in undefined)}")


def main():
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent)
    problems = []
    ops = list_ops(root, problems)
    check_struct(root, problems)
    for be, (header, table, sources) in BACKENDS.items():
        if not (root / header).exists() or not (root / table).exists():
            problems.append(f"{be}: {header} or {table} missing")
            continue
        check_backend(root, be, header, table, sources, ops, problems)
    parity = root / PARITY
    if parity.exists():
        text = strip_comments(parity.read_text())
        unused = [op for op in ops if not re.search(r"->\s*" + op + r"\s*\(", text)]
        if unused:
            problems.append(f"{PARITY}: ops the parity suite never calls: {', '.join(unused)}")
    else:
        problems.append(f"{PARITY}: missing")
    if problems:
        print("\n".join(problems))
        return 1
    print(f"ok: {len(ops)} ops in {LIST}, generated into {HEADER} and both backends, each defined by both, all called by {PARITY}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
