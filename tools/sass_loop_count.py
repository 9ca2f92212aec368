#!/usr/bin/env python3
"""Static main-loop instruction count of CUDA kernels (SASS), for the decode GEMM's budget.

Usage: tools/sass_loop_count.py FILE.o|FILE.cubin [NAME_SUBSTRING ...] [--mix N] [--weights-per-hmma W] [--innermost]

Runs `cuobjdump -sass` on FILE (cuobjdump, and the nvdisasm it calls, must be on PATH, or set
CUOBJDUMP; where the CUDA install lacks them: `pip install --target D nvidia-cuda-cuobjdump
nvidia-cuda-nvdisasm`, then PATH=D/nvidia/cu13/bin:$PATH), and for every
kernel whose mangled or demangled (c++filt, when present) name contains every NAME_SUBSTRING,
finds the main loop: of the regions [target, branch] closed by a backward branch (BRA to a lower
address) that contain an HMMA, the one with the most instructions (--innermost: of those with the
most HMMAs the one with the fewest instructions, for d8p_kernel's stage loop). Prints its instruction count
(NOPs excluded), the HMMA count, instructions per weight (each HMMA covers W weights of the
weight operand: one m16n8k32 e4m3 mma.sync is two HMMA.16816 on sm_90 and covers 16 x 32 = 512
weights once per n8 tile of activation rows, so a d8_kernel<U, T, C> of T tiles reads 256 / T
weights a HMMA - taken from the name unless --weights-per-hmma says otherwise) and the opcode mix
(the opcode without its modifiers). The wgmma kernel (d8_wg_kernel, FP4RL_D8_WGMMA) is counted by
its QGMMA instructions instead: a m64nNk32 one covers 64 x 32 = 2048 weights for all N activation
rows of the CTA, issued by the 4 warps of the warpgroup together, so 512 weights a warp's QGMMA.

Example (the d8 kernel, HiF4, M <= 8, FP32 C):
  tools/sass_loop_count.py build/cuda90/CMakeFiles/fp4rl_objects.dir/cuda/decode_fp8.cu.o 'd8_kernel<64, 1, float>'
"""
import collections
import os
import re
import shutil
import subprocess
import sys

INSN = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
FUNC = re.compile(r"^\s*Function\s*:\s*(\S+)")
BRA = re.compile(r"\bBRA\b(?:\.\S+)?\s+(?:`\(\S+\)|0x([0-9a-f]+))")


def demangle(names):
    tool = shutil.which("c++filt") or shutil.which("cu++filt")
    if not tool or not names:
        return {n: n for n in names}
    out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True).stdout.split("\n")
    return {n: (out[i] if i < len(out) and out[i] else n) for i, n in enumerate(names)}


def parse(sass):
    """{mangled name: [(address, text)]} in address order."""
    funcs, cur = {}, None
    for line in sass.splitlines():
        m = FUNC.match(line)
        if m:
            cur = funcs.setdefault(m.group(1), [])
            continue
        m = INSN.match(line)
        if m and cur is not None:
            cur.append((int(m.group(1), 16), m.group(2)))
    return funcs


def opcode(text):
    t = re.sub(r"^@!?U?P[0-9T]+\s+", "", text)  # predicate guard
    return t.split()[0].split(".")[0] if t else ""


MMA = ("HMMA", "QGMMA")  # mma.sync on sm_90 (FP16 after an unpack), wgmma E4M3


def main_loop(insns, innermost=False):
    """(lo, hi) addresses of the largest backward-branch region holding an HMMA / QGMMA, or None;
    innermost: of the regions holding the most MMAs the smallest (a persistent kernel's stage loop
    rather than its work-item loop around it, which holds the same MMAs and the epilogue)."""
    best = None
    addrs = [a for a, _ in insns]
    for a, text in insns:
        m = BRA.search(text)
        if not m or not m.group(1):
            continue
        tgt = int(m.group(1), 16)
        if tgt > a:
            continue
        body = [t for b, t in insns if tgt <= b <= a]
        if not any(opcode(t) in MMA for t in body):
            continue
        n = sum(1 for t in body if opcode(t) != "NOP")
        k = sum(1 for t in body if opcode(t) in MMA)
        if innermost:
            if best is None or k > best[3] or (k == best[3] and n < best[2]):
                best = (tgt, a, n, k)
        elif best is None or n > best[2]:
            best = (tgt, a, n, k)
    del addrs
    return best


def main(argv):
    args = [a for a in argv[1:]]
    mix_n, wph = 16, None
    innermost = "--innermost" in args
    if innermost:
        args.remove("--innermost")
    if "--mix" in args:
        i = args.index("--mix")
        mix_n = int(args[i + 1])
        del args[i : i + 2]
    if "--weights-per-hmma" in args:
        i = args.index("--weights-per-hmma")
        wph = float(args[i + 1])
        del args[i : i + 2]
    if not args:
        print(__doc__, file=sys.stderr)
        return 2
    path, subs = args[0], args[1:]
    tool = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    if not tool:
        print("cuobjdump not found (PATH or CUOBJDUMP)", file=sys.stderr)
        return 2
    sass = subprocess.run([tool, "-sass", path], capture_output=True, text=True, check=True).stdout
    funcs = parse(sass)
    names = demangle(list(funcs))
    hits = 0
    for mangled, insns in funcs.items():
        full = names[mangled]
        if not all(s in mangled or s in full for s in subs):
            continue
        loop = main_loop(insns, innermost)
        hits += 1
        print(full)
        if not loop:
            print("  no backward-branch region with HMMA")
            continue
        lo, hi, n, _ = loop
        body = [t for a, t in insns if lo <= a <= hi and opcode(t) != "NOP"]
        mix = collections.Counter(opcode(t) for t in body)
        op = "QGMMA" if mix.get("QGMMA", 0) else "HMMA"
        hmma = mix.get(op, 0)
        tiles = re.search(r"d8p?_kernel<\s*\d+,\s*(\d+)", full)
        if op == "QGMMA":
            w = wph if wph else 512  # 64 weight rows x 32 k a warpgroup (4 warps), every activation row at once
        else:
            w = wph if wph else 256 / int(tiles.group(1)) if tiles else 256  # the weight fragment serves every n8 tile
        print(f"  loop 0x{lo:04x}..0x{hi:04x}: {n} instructions, {hmma} {op}, "
              f"{n / hmma:.1f} per {op}, {n / (hmma * w):.3f} per weight ({w:g} weights a {op})")
        print("  mix: " + ", ".join(f"{k} {v}" for k, v in mix.most_common(mix_n)))
    if not hits:
        print("no kernel matches " + " ".join(repr(s) for s in subs), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
