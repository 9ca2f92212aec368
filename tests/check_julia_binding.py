#!/usr/bin/env python3
"""Structural check of the Julia binding (bindings/julia/FP4RL.jl) against the C header.

Julia is not installed on the project's machines, so the binding's own test suite cannot run in
CI. This check reads abi/include/fp4rl/fp4rl.h and the binding's Julia sources as text and
verifies what a drifting wrapper would get wrong:

  * every FP4RL_API function is reached by at least one `ccall((:name, libfp4rl()), ...)`,
    and every ccall names a function that exists in the header;
  * each ccall passes as many arguments as its type tuple lists and as the C function takes;
  * each argument type and the return type match the C types by a fixed mapping table
    (int64_t -> Int64, size_t -> Csize_t, int -> Cint, handles -> Ptr{Cvoid}, ...);
  * every @cfunction matches the C function-pointer typedef it stands for, and so do the
    argument annotations of the Julia function it wraps;
  * every host buffer passed as a raw pointer is inside a GC.@preserve of a variable it uses;
  * every C enum is mirrored by a Julia @enum with the same members and values, and every
    integer #define by a Julia const of the same value.

Usage: check_julia_binding.py [PROJECT_SOURCE_DIR] [--binding DIR] [--header FILE]
Exit status 0 when everything matches; 1 with a list of the mismatches otherwise; 2 on a usage
or parse error. Python 3 standard library only.
"""
import argparse
import os
import re
import sys

# ---------------------------------------------------------------------------------------------
# C header
# ---------------------------------------------------------------------------------------------

C_SCALARS = {
    # C type -> the Julia spellings that are the same type on every platform Julia supports
    "void": {"Cvoid", "Nothing"},
    "int": {"Cint", "Int32"},
    "unsigned": {"Cuint", "UInt32"},
    "unsigned int": {"Cuint", "UInt32"},
    "int32_t": {"Int32", "Cint"},
    "uint32_t": {"UInt32", "Cuint"},
    "int64_t": {"Int64"},
    "uint64_t": {"UInt64"},
    "size_t": {"Csize_t"},
    "double": {"Cdouble", "Float64"},
    "float": {"Cfloat", "Float32"},
    "char": {"Cchar", "UInt8", "Int8"},
    "uint8_t": {"UInt8", "Cuchar"},
    "uint16_t": {"UInt16", "Cushort"},
}
ENUM_JULIA = {"Cint", "Int32"}
HANDLE_PTR = {"Ptr{Cvoid}"}
HANDLE_PTRPTR = {"Ref{Ptr{Cvoid}}", "Ptr{Ptr{Cvoid}}"}
FNPTR_JULIA = {"Ptr{Cvoid}"}
CSTRING_IN = {"Cstring", "Ptr{UInt8}", "Ptr{Cchar}", "Ptr{Int8}", "Ptr{Cuchar}"}
CHAR_BUF = {"Ptr{UInt8}", "Ptr{Cchar}", "Ptr{Int8}", "Ptr{Cuchar}"}
VOID_PTR = {"Ptr{Cvoid}", "Ptr{Nothing}"}


def strip_c_comments(text):
    text = re.sub(r"/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


class CType:
    """A parsed C type: base name, pointer depth, const-ness of the base."""

    def __init__(self, text):
        self.text = " ".join(text.split())
        t = self.text.replace("*", " * ")
        words = t.split()
        self.depth = words.count("*")
        self.const = "const" in words
        base = [w for w in words if w not in ("*", "const")]
        self.base = " ".join(base)

    def __str__(self):
        return self.text


def split_top(s, sep=","):
    """Splits s at top-level separators (outside (), [], {})."""
    parts, depth, cur = [], 0, []
    for ch in s:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts]


def parse_c_param(p):
    """'const int64_t *shape' -> CType('const int64_t *'); a lone type stays as it is."""
    p = " ".join(p.split())
    m = re.match(r"^(.*?[\s\*])([A-Za-z_]\w*)$", p)
    if m and m.group(1).strip() and m.group(2) not in ("void", "int", "unsigned", "float", "double", "char"):
        return CType(m.group(1)), m.group(2)
    return CType(p), None


def eval_int_expr(expr, known):
    """Evaluates a #define's integer expression made of literals, known macros and + - * ( )."""
    expr = re.sub(r"\b(FP4RL_\w+)\b", lambda m: str(known[m.group(1)]) if m.group(1) in known else "?", expr)
    expr = re.sub(r"(\d+)[uUlL]+\b", r"\1", expr)
    if not re.fullmatch(r"[\d\s+\-*()]+", expr):
        return None
    return int(eval(expr, {"__builtins__": {}}, {}))  # only digits and + - * ( ) reach here


def parse_header(path):
    raw = open(path, encoding="utf-8").read()
    text = strip_c_comments(raw)
    hdr = {"functions": {}, "enums": {}, "enum_of": {}, "handles": set(), "fnptrs": {}, "defines": {}}

    for m in re.finditer(r"typedef\s+struct\s+(\w+)\s+(\w+)\s*;", text):
        hdr["handles"].add(m.group(2))

    for m in re.finditer(r"typedef\s+enum\s+(\w+)\s*\{(.*?)\}\s*(\w+)\s*;", text, re.S):
        name, body = m.group(3), m.group(2)
        members, value = {}, -1
        for item in split_top(body):
            if not item:
                continue
            mm = re.fullmatch(r"(\w+)\s*(?:=\s*(.+))?", item, re.S)
            if not mm:
                raise SystemExit(f"check_julia_binding: cannot parse enum member {item!r} of {name}")
            if mm.group(2) is not None:
                value = eval_int_expr(mm.group(2), {**hdr["defines"], **{k: v for e in hdr["enums"].values() for k, v in e.items()}, **members})
                if value is None:
                    raise SystemExit(f"check_julia_binding: cannot evaluate {mm.group(2)!r} in enum {name}")
            else:
                value += 1
            members[mm.group(1)] = value
            hdr["enum_of"][mm.group(1)] = name
        hdr["enums"][name] = members

    for m in re.finditer(r"typedef\s+([\w\s\*]+?)\(\s*\*\s*(\w+)\s*\)\s*\((.*?)\)\s*;", text, re.S):
        params = [parse_c_param(p)[0] for p in split_top(m.group(3)) if p and p != "void"]
        hdr["fnptrs"][m.group(2)] = (CType(m.group(1)), params)

    for m in re.finditer(r"^[ \t]*#[ \t]*define[ \t]+(FP4RL_\w+)[ \t]+([^\n]+)$", text, re.M):
        name, expr = m.group(1), m.group(2).strip()
        if name in ("FP4RL_API", "FP4RL_H"):
            continue
        v = eval_int_expr(expr, hdr["defines"])
        if v is not None:
            hdr["defines"][name] = v

    # Functions: drop preprocessor lines (the FP4RL_API definitions), then each declaration.
    body = re.sub(r"^[ \t]*#[^\n]*$", "", text, flags=re.M)
    for m in re.finditer(r"\bFP4RL_API\b(.*?);", body, re.S):
        decl = " ".join(m.group(1).split())
        dm = re.fullmatch(r"(.*?)\b([A-Za-z_]\w*)\s*\((.*)\)", decl)
        if not dm:
            raise SystemExit(f"check_julia_binding: cannot parse declaration {decl!r}")
        ret, name, params = CType(dm.group(1)), dm.group(2), dm.group(3).strip()
        plist = [] if params in ("", "void") else [parse_c_param(p) for p in split_top(params)]
        # comments and #lines were blanked without removing newlines, so this is the header's line
        hdr["functions"][name] = {"ret": ret, "params": plist, "line": body.count("\n", 0, m.start()) + 1}
    if not hdr["functions"]:
        raise SystemExit(f"check_julia_binding: no FP4RL_API function found in {path}")
    return hdr


def julia_types_for(ct, hdr, is_return):
    """The set of Julia spellings acceptable for C type `ct`, and a short description of it."""
    base, depth = ct.base, ct.depth
    if depth == 0:
        if base in hdr["enums"]:
            return ENUM_JULIA, f"enum {base}"
        if base in hdr["fnptrs"]:
            return FNPTR_JULIA, f"function pointer {base}"
        if base in C_SCALARS:
            return C_SCALARS[base], base
        return set(), f"unmapped C type {ct}"
    if base in hdr["handles"]:
        if depth == 1:
            return HANDLE_PTR, f"handle {base}*"
        if depth == 2:
            return HANDLE_PTRPTR, f"handle out-parameter {base}**"
    if depth == 1:
        if base == "char":
            if ct.const:
                return CSTRING_IN, "const char* (string)"
            return CHAR_BUF, "char* (buffer)"
        if base == "void":
            return VOID_PTR, "void* (buffer)"
        if base in hdr["enums"]:
            inner = ENUM_JULIA
        elif base in C_SCALARS:
            inner = C_SCALARS[base]
        else:
            return set(), f"unmapped C type {ct}"
        allowed = {f"Ptr{{{j}}}" for j in inner}
        if not is_return:
            allowed |= {f"Ref{{{j}}}" for j in inner}
        return allowed, f"{ct}"
    return set(), f"unmapped C type {ct}"


def is_host_buffer(ct, hdr):
    """A pointer to host memory (not a handle, not a function pointer)."""
    return ct.depth >= 1 and ct.base not in hdr["handles"]


# ---------------------------------------------------------------------------------------------
# Julia sources
# ---------------------------------------------------------------------------------------------

def sanitize_julia(text):
    """Same-length copy of `text` with comments and the contents of string and char literals
    blanked (newlines kept), so that structure can be parsed with positions intact. String
    interpolations $( ... ) are kept as code."""
    out = list(text)
    n = len(text)

    def blank(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    def scan_code(i, closing):
        """Scans code from i until the `closing` paren at depth 0 (or the end); returns the index after it."""
        depth = 0
        while i < n:
            c = text[i]
            if c == "#":
                if text.startswith("#=", i):
                    j, d = i + 2, 1
                    while j < n and d:
                        if text.startswith("#=", j):
                            d, j = d + 1, j + 2
                        elif text.startswith("=#", j):
                            d, j = d - 1, j + 2
                        else:
                            j += 1
                    blank(i, j)
                    i = j
                else:
                    j = text.find("\n", i)
                    j = n if j < 0 else j
                    blank(i, j)
                    i = j
                continue
            if c == '"':
                i = scan_string(i)
                continue
            if c == "'":
                prev = text[i - 1] if i > 0 else " "
                if prev.isalnum() or prev in "_)]}'." :
                    i += 1          # the adjoint operator
                    continue
                m = re.match(r"'(\\.[^']*|[^'\\])'", text[i:])
                if m:
                    blank(i + 1, i + len(m.group(0)) - 1)
                    i += len(m.group(0))
                    continue
                i += 1
                continue
            if closing and c in "([{":
                depth += 1
            elif closing and c in ")]}":
                if depth == 0 and c == closing:
                    return i + 1
                depth -= 1
            i += 1
        return i

    def scan_string(i):
        triple = text.startswith('"""', i)
        q = '"""' if triple else '"'
        j = i + len(q)
        start = j
        while j < n:
            if text[j] == "\\":
                j += 2
                continue
            if text.startswith("$(", j):
                blank(start, j)
                j = scan_code(j + 2, ")")
                start = j
                continue
            if text.startswith(q, j):
                blank(start, j)
                return j + len(q)
            j += 1
        blank(start, n)
        return n

    scan_code(0, None)
    return "".join(out)


def match_paren(s, i):
    """Index just past the bracket matching the opener at s[i]."""
    pairs = {"(": ")", "[": "]", "{": "}"}
    stack = []
    for k in range(i, len(s)):
        c = s[k]
        if c in pairs:
            stack.append(pairs[c])
        elif c in ")]}":
            if not stack or stack.pop() != c:
                return -1
            if not stack:
                return k + 1
    return -1


BLOCK_OPENERS = {"function", "if", "for", "while", "let", "begin", "try", "do", "quote", "struct", "module",
                 "baremodule", "macro"}


def block_extents(code):
    """(start, end) of every keyword block (`begin ... end`, `function ... end`, ...), with the
    opener's word. `end` inside [ ] is an index, and for/if inside brackets are generators."""
    extents, stack = [], []
    for m in re.finditer(r"[A-Za-z_][\w!]*|[()\[\]{}]", code):
        tok, pos = m.group(0), m.start()
        if pos > 0 and code[pos - 1] in ".:@" and tok not in "()[]{}":
            continue  # a field, a symbol or a macro name, not a keyword
        if tok in "([{":
            stack.append((tok, pos))
        elif tok in ")]}":
            while stack and stack[-1][0] not in "([{":
                stack.pop()  # an unterminated block: leave it to the caller's sanity
            if stack:
                stack.pop()
        elif tok in BLOCK_OPENERS or (tok in ("abstract", "primitive") and code[m.end():].lstrip().startswith("type")):
            inside_bracket = stack and stack[-1][0] in "([{"
            if tok in ("for", "if") and inside_bracket:
                continue
            if tok == "begin" and stack and stack[-1][0] == "[":
                continue
            stack.append((tok, pos))
        elif tok == "end":
            if stack and stack[-1][0] in "([{":
                continue
            if stack:
                opener, start = stack.pop()
                extents.append((start, m.end(), opener))
    return extents


def preserve_regions(code):
    """(start, end, names) of every GC.@preserve: the names it roots and the code it covers."""
    blocks = {start: end for start, end, opener in block_extents(code) if opener == "begin"}
    regions = []
    for m in re.finditer(r"GC\.@preserve\b", code):
        i, names = m.end(), []
        while True:
            w = re.match(r"[ \t]+([A-Za-z_]\w*)", code[i:])
            if not w:
                break
            word, wend = w.group(1), i + w.end()
            if word == "begin":
                start = i + w.start(1)
                regions.append((start, blocks.get(start, start), names))
                break
            nxt = code[wend:wend + 1]
            if nxt in ("(", ".", "["):
                # the body is one expression starting here, e.g. ccall(...)
                start = i + w.start(1)
                end = start
                k = wend
                while k < len(code) and code[k] in "([.{":
                    if code[k] == ".":
                        k += 1
                        wm = re.match(r"[A-Za-z_]\w*", code[k:])
                        k += wm.end() if wm else 0
                        continue
                    e = match_paren(code, k)
                    if e < 0:
                        break
                    k = e
                end = k
                regions.append((start, end, names))
                break
            names.append(word)
            i = wend
    return regions


def line_of(text, pos):
    return text.count("\n", 0, pos) + 1


def norm_type(t):
    return re.sub(r"\s+", "", t)


def parse_ccalls(path, raw, code, problems):
    calls = []
    for m in re.finditer(r"@ccall\b", code):
        problems.append(f"{path}:{line_of(code, m.start())}: @ccall is not read by this check; "
                        f"write ccall((:name, libfp4rl()), Ret, (Args...), ...)")
    for m in re.finditer(r"(?<![\w.@])ccall\s*\(", code):
        open_ = m.end() - 1
        close = match_paren(code, open_)
        where = f"{path}:{line_of(code, m.start())}"
        if close < 0:
            problems.append(f"{where}: unbalanced ccall(")
            continue
        args = split_top(code[open_ + 1:close - 1])
        if len(args) < 3:
            problems.append(f"{where}: ccall with fewer than 3 arguments")
            continue
        tm = re.fullmatch(r"\(\s*:(\w+)\s*,\s*(.+?)\s*\)", args[0], re.S)
        if not tm:
            problems.append(f"{where}: ccall target {args[0]!r} is not (:name, libfp4rl())")
            continue
        name, lib = tm.group(1), norm_type(tm.group(2))
        if lib != "libfp4rl()":
            # quote the library expression from the unblanked source (positions are the same)
            first = open_ + 1 + len(code[open_ + 1:close - 1]) - len(code[open_ + 1:close - 1].lstrip())
            shown = " ".join(raw[first:first + len(args[0])].split())
            problems.append(f"{where}: {name}: library in `{shown}` is not libfp4rl()")
        tup = args[2].strip()
        if not (tup.startswith("(") and match_paren(tup, 0) == len(tup)):
            problems.append(f"{where}: {name}: argument types {tup!r} are not a literal tuple")
            continue
        inner = tup[1:-1].strip()
        types = [t for t in split_top(inner)] if inner else []
        if types and types[-1] == "":
            types = types[:-1]  # (T,)
        calls.append({"name": name, "ret": norm_type(args[1]), "types": [norm_type(t) for t in types],
                      "values": [" ".join(v.split()) for v in args[3:]], "where": where, "pos": m.start(),
                      "path": path})
    return calls


def parse_cfunctions(path, code, problems):
    out = []
    for m in re.finditer(r"@cfunction\s*\(", code):
        close = match_paren(code, m.end() - 1)
        args = split_top(code[m.end():close - 1])
        where = f"{path}:{line_of(code, m.start())}"
        if len(args) != 3:
            problems.append(f"{where}: @cfunction with {len(args)} arguments")
            continue
        tup = args[2].strip()
        inner = tup[1:-1].strip() if tup.startswith("(") else tup
        types = [norm_type(t) for t in split_top(inner) if t.strip()] if inner else []
        out.append({"func": args[0].strip().lstrip("$"), "ret": norm_type(args[1]), "types": types, "where": where})
    return out


def parse_function_signature(code, fname):
    """Argument annotations and return annotation of `function fname(...)::Ret`."""
    m = re.search(r"\bfunction\s+" + re.escape(fname) + r"\s*\(", code)
    if not m:
        return None
    close = match_paren(code, m.end() - 1)
    params = split_top(code[m.end():close - 1])
    anns = []
    for p in params:
        pm = re.fullmatch(r"\s*\w+\s*::\s*(.+?)\s*", p, re.S)
        anns.append(norm_type(pm.group(1)) if pm else None)
    rm = re.match(r"\s*::\s*([\w{}]+)", code[close:])
    return anns, (norm_type(rm.group(1)) if rm else None)


def parse_enums(path, code):
    enums = []
    for m in re.finditer(r"@enum\s+(\w+)(?:\s*::\s*(\w+))?\s+begin\b", code):
        end = re.search(r"\bend\b", code[m.end():])
        body = code[m.end():m.end() + end.start()]
        members = [(mm.group(1), int(mm.group(2))) for mm in re.finditer(r"\b([A-Za-z_]\w*)\s*=\s*(-?\d+)", body)]
        names_without_value = [w for w in re.findall(r"^\s*([A-Za-z_]\w*)\s*$", body, re.M)]
        enums.append({"name": m.group(1), "base": m.group(2), "members": members, "implicit": names_without_value,
                      "where": f"{path}:{line_of(code, m.start())}"})
    for m in re.finditer(r"@enum\s+(\w+)(?:\s*::\s*(\w+))?[ \t]+(?!begin\b)([^\n]+)", code):
        members = [(mm.group(1), int(mm.group(2))) for mm in re.finditer(r"\b([A-Za-z_]\w*)\s*=\s*(-?\d+)", m.group(3))]
        implicit = [w for w in m.group(3).split() if "=" not in w]
        enums.append({"name": m.group(1), "base": m.group(2), "members": members, "implicit": implicit,
                      "where": f"{path}:{line_of(code, m.start())}"})
    return enums


def parse_consts(path, code):
    return [(m.group(1), int(m.group(2)), f"{path}:{line_of(code, m.start())}")
            for m in re.finditer(r"^const\s+([A-Z][A-Z0-9_]*)\s*=\s*(-?\d+)\s*$", code, re.M)]


# ---------------------------------------------------------------------------------------------
# the checks
# ---------------------------------------------------------------------------------------------

def check(header_path, binding_dir):
    hdr = parse_header(header_path)
    problems = []
    files = []
    for root, _, names in os.walk(binding_dir):
        for n in sorted(names):
            if n.endswith(".jl"):
                files.append(os.path.join(root, n))
    files.sort()
    if not any(os.sep + "src" + os.sep in f for f in files):
        raise SystemExit(f"check_julia_binding: no Julia sources under {binding_dir}/src")

    calls, cfuncs, enums, consts, codes = [], [], [], [], {}
    for f in files:
        raw = open(f, encoding="utf-8").read()
        code = sanitize_julia(raw)
        rel = os.path.relpath(f, binding_dir)
        codes[rel] = code
        fc = parse_ccalls(rel, raw, code, problems)
        regions = preserve_regions(code)
        for c in fc:
            c["preserved"] = set()
            for start, end, names in regions:
                if start <= c["pos"] < end:
                    c["preserved"].update(names)
        calls += fc
        cfuncs += [dict(x, path=rel) for x in parse_cfunctions(rel, code, problems)]
        enums += parse_enums(rel, code)
        consts += parse_consts(rel, code)

    # ---- ccalls ----
    wrapped = set()
    for c in calls:
        fn = hdr["functions"].get(c["name"])
        if fn is None:
            problems.append(f"{c['where']}: ccall of {c['name']}, which fp4rl.h does not declare")
            continue
        wrapped.add(c["name"])
        params = fn["params"]
        if len(c["types"]) != len(params):
            problems.append(f"{c['where']}: {c['name']}: {len(c['types'])} argument types, the C function takes {len(params)}")
        if len(c["values"]) != len(c["types"]):
            problems.append(f"{c['where']}: {c['name']}: {len(c['values'])} arguments passed for {len(c['types'])} argument types")
        allowed, desc = julia_types_for(fn["ret"], hdr, True)
        if c["ret"] not in allowed:
            problems.append(f"{c['where']}: {c['name']}: return type {c['ret']}, C returns {desc} "
                            f"(expected one of {', '.join(sorted(allowed)) or 'nothing mapped'})")
        for k, (jt, (ct, pname)) in enumerate(zip(c["types"], params)):
            allowed, desc = julia_types_for(ct, hdr, False)
            if jt not in allowed:
                problems.append(f"{c['where']}: {c['name']}: argument {k + 1} ({pname}) is {jt}, C has {desc} "
                                f"(expected one of {', '.join(sorted(allowed)) or 'nothing mapped'})")
                continue
            # a raw pointer to host memory must point into something rooted by GC.@preserve
            if is_host_buffer(ct, hdr) and jt.startswith("Ptr{") and k < len(c["values"]):
                v = c["values"][k]
                if re.fullmatch(r"(C_NULL|Ptr\{[\w{}]+\}\(C_NULL\))", v.replace(" ", "")):
                    continue
                idents = set(re.findall(r"[A-Za-z_]\w*", v))
                if not (idents & c["preserved"]):
                    problems.append(f"{c['where']}: {c['name']}: argument {k + 1} ({pname}) passes host memory `{v}` "
                                    f"outside a GC.@preserve of it (preserved here: {', '.join(sorted(c['preserved'])) or 'none'})")
    for name, fn in sorted(hdr["functions"].items()):
        if name not in wrapped:
            problems.append(f"fp4rl.h:{fn['line']}: {name} is not wrapped by any ccall")

    # ---- @cfunction against the function-pointer typedefs ----
    for cf in cfuncs:
        best = None
        for tname, (ret, params) in hdr["fnptrs"].items():
            errs = []
            allowed, desc = julia_types_for(ret, hdr, True)
            if cf["ret"] not in allowed:
                errs.append(f"return type {cf['ret']}, {tname} returns {desc}")
            if len(cf["types"]) != len(params):
                errs.append(f"{len(cf['types'])} argument types, {tname} takes {len(params)}")
            else:
                for k, (jt, ct) in enumerate(zip(cf["types"], params)):
                    allowed, desc = julia_types_for(ct, hdr, False)
                    allowed = {a for a in allowed if not a.startswith("Ref{")}  # C passes raw pointers
                    if jt not in allowed:
                        errs.append(f"argument {k + 1} is {jt}, {tname} has {desc}")
            if best is None or len(errs) < len(best[1]):
                best = (tname, errs)
        if best is None:
            problems.append(f"{cf['where']}: @cfunction but fp4rl.h has no function-pointer typedef")
            continue
        for e in best[1]:
            problems.append(f"{cf['where']}: @cfunction({cf['func']}) vs {best[0]}: {e}")
        if not best[1]:
            sig = None
            for code in codes.values():
                sig = parse_function_signature(code, cf["func"])
                if sig:
                    break
            if sig is None:
                problems.append(f"{cf['where']}: the function {cf['func']} of @cfunction is not defined as `function {cf['func']}(...)`")
            else:
                anns, ret = sig
                if anns != cf["types"]:
                    problems.append(f"{cf['where']}: {cf['func']} declares argument types {anns}, @cfunction passes {cf['types']}")
                if ret != cf["ret"]:
                    problems.append(f"{cf['where']}: {cf['func']} declares return type {ret}, @cfunction expects {cf['ret']}")
    if hdr["fnptrs"] and not cfuncs:
        problems.append("no @cfunction for the header's function-pointer typedefs: " + ", ".join(sorted(hdr["fnptrs"])))

    # ---- enums ----
    mirrored = set()
    for e in enums:
        if e["implicit"]:
            problems.append(f"{e['where']}: @enum {e['name']}: members without an explicit value: {', '.join(e['implicit'])}")
        if e["base"] not in (None, "Cint", "Int32"):
            problems.append(f"{e['where']}: @enum {e['name']}::{e['base']}: C enums are int; use Cint")
        c_enums = set()
        for jname, value in e["members"]:
            cname = "FP4RL_" + jname
            cenum = hdr["enum_of"].get(cname)
            if cenum is None:
                problems.append(f"{e['where']}: {e['name']}.{jname}: no {cname} in fp4rl.h")
                continue
            c_enums.add(cenum)
            cval = hdr["enums"][cenum][cname]
            if cval != value:
                problems.append(f"{e['where']}: {jname} = {value}, but {cname} = {cval} in fp4rl.h")
        if len(c_enums) > 1:
            problems.append(f"{e['where']}: @enum {e['name']} mixes members of the C enums {', '.join(sorted(c_enums))}")
        for cenum in c_enums:
            mirrored.add(cenum)
            have = {"FP4RL_" + j for j, _ in e["members"]}
            missing = [c for c in hdr["enums"][cenum] if c not in have]
            if missing:
                problems.append(f"{e['where']}: @enum {e['name']} lacks {', '.join(missing)} of {cenum}")
    for cenum in sorted(set(hdr["enums"]) - mirrored):
        problems.append(f"fp4rl.h: enum {cenum} has no Julia @enum")

    # ---- integer #defines ----
    jconsts = {}
    for name, value, where in consts:
        jconsts[name] = (value, where)
        cname = "FP4RL_" + name
        if cname in hdr["defines"] and hdr["defines"][cname] != value:
            problems.append(f"{where}: const {name} = {value}, but {cname} = {hdr['defines'][cname]} in fp4rl.h")
    for cname, value in sorted(hdr["defines"].items()):
        if cname[len("FP4RL_"):] not in jconsts:
            problems.append(f"fp4rl.h: #define {cname} {value} has no Julia const {cname[len('FP4RL_'):]}")

    summary = (f"{len(hdr['functions'])} C functions, {len(calls)} ccall sites in {len(files)} Julia files, "
               f"{len(cfuncs)} @cfunction, {len(hdr['enums'])} enums "
               f"({sum(len(v) for v in hdr['enums'].values())} constants), {len(hdr['defines'])} #defines")
    return problems, summary


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root", nargs="?", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    help="the project's source directory (default: the parent of tests/)")
    ap.add_argument("--binding", help="the Julia package (default: ROOT/bindings/julia/FP4RL.jl)")
    ap.add_argument("--header", help="the C header (default: ROOT/abi/include/fp4rl/fp4rl.h)")
    a = ap.parse_args(argv)
    header = a.header or os.path.join(a.root, "abi", "include", "fp4rl", "fp4rl.h")
    binding = a.binding or os.path.join(a.root, "bindings", "julia", "FP4RL.jl")
    for p in (header, binding):
        if not os.path.exists(p):
            print(f"check_julia_binding: {p} does not exist", file=sys.stderr)
            return 2
    problems, summary = check(header, binding)
    if problems:
        print(f"check_julia_binding: FAILED: {len(problems)} mismatch(es) between {binding} and {header}:")
        for p in problems:
            print("  " + p)
        print(f"({summary})")
        return 1
    print(f"check_julia_binding: OK: {summary}; every function wrapped, argument counts, C types, "
          f"callback signature, GC.@preserve of host buffers, enum values and constants match")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
