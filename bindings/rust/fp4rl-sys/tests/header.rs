//! The declarations in src/lib.rs against the C header, so that they cannot drift apart.
//!
//! Both sides are parsed as text with small hand-written parsers (no bindgen: no external
//! crates here): the header's FP4RL_API functions (name, return type, every parameter's name and
//! type), its enums (every enumerator's value, and the typedef it belongs to), its integer
//! #defines, its opaque handle typedefs and the reward callback typedef; lib.rs's `extern "C"`
//! block, `pub const`s, `pub type`s and `pub struct`s. C types are mapped to the Rust spelling
//! lib.rs uses (`const T *` -> `*const T`, `size_t` -> `usize`, `int` -> `c_int`, ...) and the
//! two must be equal. The header is checked twice when both exist: the one in the repository
//! (abi/include/fp4rl/fp4rl.h, the source of truth) and the one installed next to the library
//! the tests link (found by build.rs through pkg-config).
//!
//! Runtime checks then tie the constants to the linked library: every status constant's value
//! has the name fp4rl_status_name() gives it, every dtype its fp4rl_dtype_name(), and a table
//! taking the address of every declared function makes the linker resolve each one.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::CStr;
use std::path::PathBuf;

// ------------------------------------------------------------------------------------------
// A tiny integer-expression evaluator (+, -, *, parentheses, names), enough for enumerator
// initialisers and FP4RL_VERSION_NUMBER on both sides.
// ------------------------------------------------------------------------------------------
fn eval(expr: &str, names: &BTreeMap<String, i64>) -> Result<i64, String> {
    let toks = tokenize(expr);
    let mut pos = 0;
    let v = eval_sum(&toks, &mut pos, names)?;
    if pos != toks.len() {
        return Err(format!("trailing tokens in `{expr}`"));
    }
    Ok(v)
}

fn eval_sum(t: &[String], pos: &mut usize, names: &BTreeMap<String, i64>) -> Result<i64, String> {
    let mut v = eval_product(t, pos, names)?;
    while *pos < t.len() && (t[*pos] == "+" || t[*pos] == "-") {
        let op = t[*pos].clone();
        *pos += 1;
        let r = eval_product(t, pos, names)?;
        v = if op == "+" { v + r } else { v - r };
    }
    Ok(v)
}

fn eval_product(t: &[String], pos: &mut usize, names: &BTreeMap<String, i64>) -> Result<i64, String> {
    let mut v = eval_atom(t, pos, names)?;
    while *pos < t.len() && t[*pos] == "*" {
        *pos += 1;
        v *= eval_atom(t, pos, names)?;
    }
    Ok(v)
}

fn eval_atom(t: &[String], pos: &mut usize, names: &BTreeMap<String, i64>) -> Result<i64, String> {
    let tok = t.get(*pos).ok_or("unexpected end of expression")?.clone();
    *pos += 1;
    if tok == "(" {
        let v = eval_sum(t, pos, names)?;
        if t.get(*pos).map(String::as_str) != Some(")") {
            return Err("missing )".into());
        }
        *pos += 1;
        return Ok(v);
    }
    if tok == "-" {
        return Ok(-eval_atom(t, pos, names)?);
    }
    if let Ok(v) = tok.trim_end_matches(['u', 'U', 'l', 'L']).parse::<i64>() {
        return Ok(v);
    }
    names
        .get(&tok)
        .copied()
        .ok_or_else(|| format!("unknown name `{tok}` in an expression"))
}

// Identifiers/numbers, "::" and single punctuation characters; string literals as one token.
fn tokenize(s: &str) -> Vec<String> {
    let c: Vec<char> = s.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < c.len() {
        if c[i].is_whitespace() {
            i += 1;
        } else if c[i].is_alphanumeric() || c[i] == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            out.push(c[start..i].iter().collect());
        } else if c[i] == '"' {
            let start = i;
            i += 1;
            while i < c.len() && c[i] != '"' {
                i += 1;
            }
            i += 1;
            out.push(c[start..i.min(c.len())].iter().collect());
        } else if c[i] == ':' && c.get(i + 1) == Some(&':') {
            out.push("::".into());
            i += 2;
        } else if c[i] == '-' && c.get(i + 1) == Some(&'>') {
            out.push("->".into());
            i += 2;
        } else {
            out.push(c[i].to_string());
            i += 1;
        }
    }
    out
}

// Splits a token list on `sep` at parenthesis/angle depth 0.
fn split_top(toks: &[String], sep: &str) -> Vec<Vec<String>> {
    let mut parts = vec![Vec::new()];
    let mut depth = 0i32;
    for t in toks {
        match t.as_str() {
            "(" | "<" => depth += 1,
            ")" | ">" => depth -= 1,
            _ => {}
        }
        if depth == 0 && t == sep {
            parts.push(Vec::new());
        } else {
            parts.last_mut().unwrap().push(t.clone());
        }
    }
    if parts.len() == 1 && parts[0].is_empty() {
        parts.clear();
    }
    parts
}

fn strip_c_comments(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
            i += 2;
            while i + 1 < b.len() && !(b[i] == b'*' && b[i + 1] == b'/') {
                if b[i] == b'\n' {
                    out.push('\n'); // keep line structure for the #define scan
                }
                i += 1;
            }
            i += 2;
            out.push(' ');
        } else if b[i] == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    out
}

// ------------------------------------------------------------------------------------------
// A C declaration, normalised to the Rust spelling.
// ------------------------------------------------------------------------------------------
#[derive(Debug, Clone, PartialEq, Eq)]
struct Param {
    name: String,
    ty: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Func {
    ret: String,
    params: Vec<Param>,
}

#[derive(Debug, Default)]
struct Api {
    funcs: BTreeMap<String, Func>,
    /// enumerator / #define -> (the enum typedef it belongs to, or "" for a #define; value)
    consts: BTreeMap<String, (String, i64)>,
    enum_types: BTreeSet<String>,
    opaque: BTreeSet<String>,
    callbacks: BTreeMap<String, Func>,
}

fn c_base_to_rust(t: &str) -> String {
    match t {
        "void" => "c_void",
        "int" => "c_int",
        "unsigned" => "c_uint",
        "char" => "c_char",
        "float" => "c_float",
        "double" => "c_double",
        "int32_t" => "i32",
        "int64_t" => "i64",
        "uint64_t" => "u64",
        "size_t" => "usize",
        other => other, // fp4rl_* typedefs keep their names
    }
    .to_string()
}

// `const int64_t *` -> `*const i64`; `fp4rl_tensor **` -> `*mut *mut fp4rl_tensor`.
fn c_type_to_rust(toks: &[String]) -> Result<String, String> {
    let mut base: Option<String> = None;
    let mut base_const = false;
    let mut stars: Vec<bool> = Vec::new(); // for each '*': is its pointee const
    let mut pending_const = false;
    for t in toks {
        match t.as_str() {
            "const" => {
                if base.is_none() || stars.is_empty() {
                    base_const = true;
                } else {
                    pending_const = true; // `T * const`: the pointer itself is const
                }
            }
            "*" => {
                // `T *const *p`: the second pointer's pointee (the first pointer) is const
                let pointee_const = if stars.is_empty() { base_const } else { pending_const };
                stars.push(pointee_const);
                pending_const = false;
            }
            "unsigned" if base.as_deref() == Some("int") || base.is_none() => base = Some("unsigned".into()),
            "int" if base.as_deref() == Some("unsigned") => {}
            "struct" | "enum" => return Err(format!("tagged type in a parameter: {toks:?}")),
            name => {
                if base.is_some() {
                    return Err(format!("two base types in {toks:?}"));
                }
                base = Some(name.to_string());
            }
        }
    }
    let mut ty = c_base_to_rust(&base.ok_or_else(|| format!("no type in {toks:?}"))?);
    for pointee_const in stars {
        ty = format!("*{} {ty}", if pointee_const { "const" } else { "mut" });
    }
    Ok(ty)
}

// One C parameter `TYPE NAME` (or `void` alone, handled by the caller).
fn c_param(toks: &[String]) -> Result<Param, String> {
    let (name, ty) = toks.split_last().ok_or("empty parameter")?;
    if !name.chars().all(|c| c.is_alphanumeric() || c == '_') || ty.is_empty() {
        return Err(format!(
            "unnamed or malformed parameter {toks:?}: the header names every parameter"
        ));
    }
    Ok(Param {
        name: name.clone(),
        ty: c_type_to_rust(ty)?,
    })
}

fn c_params(toks: &[String]) -> Result<Vec<Param>, String> {
    if toks.len() == 1 && toks[0] == "void" {
        return Ok(Vec::new());
    }
    split_top(toks, ",").iter().map(|p| c_param(p)).collect()
}

fn c_ret(toks: &[String]) -> Result<String, String> {
    if toks.len() == 1 && toks[0] == "void" {
        Ok("()".into())
    } else {
        c_type_to_rust(toks)
    }
}

fn parse_header(src: &str) -> Result<Api, String> {
    let text = strip_c_comments(src);
    let mut api = Api::default();
    let mut body = String::new();
    for line in text.lines() {
        let l = line.trim();
        if let Some(rest) = l.strip_prefix("#") {
            let rest = rest.trim();
            if let Some(def) = rest.strip_prefix("define") {
                let def = def.trim();
                let (name, value) = def.split_once(char::is_whitespace).unwrap_or((def, ""));
                let value = value.trim();
                // Integer constants only: FP4RL_API (an attribute) and the include guard are not.
                if name.starts_with("FP4RL_") && !value.is_empty() && !value.contains("__attribute__") {
                    let names: BTreeMap<String, i64> = api.consts.iter().map(|(k, (_, v))| (k.clone(), *v)).collect();
                    let v = eval(value, &names).map_err(|e| format!("#define {name}: {e}"))?;
                    api.consts.insert(name.to_string(), (String::new(), v));
                }
            }
            continue; // every other directive (includes, #if, extern "C" guards) is not an API
        }
        body.push_str(line);
        body.push('\n');
    }
    // The C++ guard's `extern "C" {` and `}` sit on lines of their own between #ifdef
    // __cplusplus and #endif; the directive filter keeps them, so drop them here.
    let mut toks = tokenize(&body);
    if let Some(i) = toks
        .windows(3)
        .position(|w| w[0] == "extern" && w[1] == "\"C\"" && w[2] == "{")
    {
        toks.drain(i..i + 3);
        let close = toks.iter().rposition(|t| t == "}").ok_or("extern \"C\" { without }")?;
        toks.remove(close);
    }
    for s in split_top(&toks, ";") {
        if s.is_empty() {
            continue;
        }
        let first = s[0].as_str();
        if first == "FP4RL_API" {
            // FP4RL_API RET NAME ( PARAMS )
            let open = s
                .iter()
                .position(|t| t == "(")
                .ok_or_else(|| format!("no ( in {s:?}"))?;
            if s.last().map(String::as_str) != Some(")") {
                return Err(format!("function declaration does not end with ): {s:?}"));
            }
            let name = s[open - 1].clone();
            let ret = c_ret(&s[1..open - 1])?;
            let params = c_params(&s[open + 1..s.len() - 1]).map_err(|e| format!("{name}: {e}"))?;
            if api.funcs.insert(name.clone(), Func { ret, params }).is_some() {
                return Err(format!("{name} declared twice"));
            }
        } else if first == "typedef" && s.get(1).map(String::as_str) == Some("enum") {
            // typedef enum TAG { A = 0, B, ... } NAME
            let open = s.iter().position(|t| t == "{").ok_or("enum without {")?;
            let close = s.iter().rposition(|t| t == "}").ok_or("enum without }")?;
            let name = s[close + 1..].join("");
            api.enum_types.insert(name.clone());
            let mut next = 0i64;
            for e in split_top(&s[open + 1..close], ",") {
                if e.is_empty() {
                    continue;
                }
                let value = if e.len() > 2 && e[1] == "=" {
                    let names: BTreeMap<String, i64> = api.consts.iter().map(|(k, (_, v))| (k.clone(), *v)).collect();
                    eval(&e[2..].join(" "), &names).map_err(|x| format!("{}: {x}", e[0]))?
                } else if e.len() == 1 {
                    next
                } else {
                    return Err(format!("malformed enumerator {e:?}"));
                };
                api.consts.insert(e[0].clone(), (name.clone(), value));
                next = value + 1;
            }
        } else if first == "typedef" && s.get(1).map(String::as_str) == Some("struct") {
            // typedef struct NAME NAME: an opaque handle
            if s.len() != 4 || s[2] != s[3] {
                return Err(format!(
                    "unexpected struct typedef {s:?}: the ABI has only opaque handles"
                ));
            }
            api.opaque.insert(s[3].clone());
        } else if first == "typedef" && s.iter().any(|t| t == "(") {
            // typedef RET (*NAME)(PARAMS): a callback type
            let open = s.iter().position(|t| t == "(").unwrap();
            if s.get(open + 1).map(String::as_str) != Some("*") || s.get(open + 3).map(String::as_str) != Some(")") {
                return Err(format!("unexpected function typedef {s:?}"));
            }
            let name = s[open + 2].clone();
            let ret = c_ret(&s[1..open])?;
            let params = c_params(&s[open + 5..s.len() - 1]).map_err(|e| format!("{name}: {e}"))?;
            api.callbacks.insert(name, Func { ret, params });
        } else {
            return Err(format!(
                "a header statement this parser does not know (teach it): {s:?}"
            ));
        }
    }
    Ok(api)
}

// ------------------------------------------------------------------------------------------
// lib.rs
// ------------------------------------------------------------------------------------------
fn strip_rust_line_comments(src: &str) -> String {
    src.lines()
        .map(|l| l.split("//").next().unwrap())
        .collect::<Vec<_>>()
        .join("\n")
}

// A Rust type from tokens: `core::ffi::c_int` -> `c_int`, `* const T` -> `*const T`.
fn rust_type(toks: &[String]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        let t = &toks[i];
        if toks.get(i + 1).map(String::as_str) == Some("::") {
            i += 2; // drop a path segment
            continue;
        }
        if t == "*" {
            let kind = toks.get(i + 1).cloned().unwrap_or_default();
            out.push(format!("*{kind}"));
            i += 2;
            continue;
        }
        out.push(t.clone());
        i += 1;
    }
    out.join(" ")
}

fn rust_fn_sig(toks: &[String]) -> Result<Func, String> {
    // `( PARAMS ) [-> RET]`
    if toks.first().map(String::as_str) != Some("(") {
        return Err(format!("expected ( in {toks:?}"));
    }
    let mut depth = 0;
    let mut close = 0;
    for (i, t) in toks.iter().enumerate() {
        if t == "(" {
            depth += 1;
        } else if t == ")" {
            depth -= 1;
            if depth == 0 {
                close = i;
                break;
            }
        }
    }
    let mut params = Vec::new();
    for p in split_top(&toks[1..close], ",") {
        if p.is_empty() {
            continue; // trailing comma
        }
        if p.len() < 3 || p[1] != ":" {
            return Err(format!("parameter without a name: {p:?}"));
        }
        params.push(Param {
            name: p[0].clone(),
            ty: rust_type(&p[2..]),
        });
    }
    let ret = match toks.get(close + 1).map(String::as_str) {
        None => "()".to_string(),
        // `-> c_int,` inside `Option<... -> c_int,>` (rustfmt's trailing comma)
        Some("->") => rust_type(
            toks[close + 2..]
                .strip_suffix(&[",".to_string()])
                .unwrap_or(&toks[close + 2..]),
        ),
        Some(x) => return Err(format!("unexpected `{x}` after the parameters")),
    };
    Ok(Func { ret, params })
}

fn parse_rust(src: &str) -> Result<Api, String> {
    let text = strip_rust_line_comments(src);
    let mut api = Api::default();
    let start = text.find("extern \"C\" {").ok_or("no extern \"C\" block in lib.rs")?;
    let end = start + text[start..].find("\n}").ok_or("unterminated extern block")?;
    for item in text[start + "extern \"C\" {".len()..end].split(';') {
        let t = tokenize(item);
        if t.is_empty() {
            continue;
        }
        if t.len() < 3 || t[0] != "pub" || t[1] != "fn" {
            return Err(format!("unexpected item in the extern block: {t:?}"));
        }
        let f = rust_fn_sig(&t[3..]).map_err(|e| format!("{}: {e}", t[2]))?;
        if api.funcs.insert(t[2].clone(), f).is_some() {
            return Err(format!("{} declared twice", t[2]));
        }
    }
    let outside = format!("{}{}", &text[..start], &text[end..]);
    let items: Vec<Vec<String>> = split_top(&tokenize(&outside), ";");
    let mut names: BTreeMap<String, i64> = BTreeMap::new();
    let mut aliases: BTreeMap<String, String> = BTreeMap::new();
    for it in &items {
        // skip attributes (#[...]) and anything before `pub`
        let Some(p) = it.iter().position(|t| t == "pub") else {
            continue;
        };
        let it = &it[p..];
        match it.get(1).map(String::as_str) {
            Some("const") => {
                // pub const NAME: TYPE = EXPR
                let eq = it.iter().position(|t| t == "=").ok_or("const without =")?;
                let name = it[2].clone();
                let ty = rust_type(&it[4..eq]);
                let v = eval(&it[eq + 1..].join(" "), &names).map_err(|e| format!("{name}: {e}"))?;
                names.insert(name.clone(), v);
                api.consts.insert(name, (ty, v));
            }
            Some("type") => {
                let eq = it.iter().position(|t| t == "=").ok_or("type without =")?;
                let name = it[2].clone();
                let rhs = &it[eq + 1..];
                // Option < unsafe extern "C" fn ( ... ) -> RET >: a callback
                if rhs.first().map(String::as_str) == Some("Option") {
                    let fnpos = rhs.iter().position(|t| t == "fn").ok_or("Option without fn")?;
                    let inner = &rhs[fnpos + 1..rhs.len() - 1]; // drop the closing >
                    api.callbacks.insert(name, rust_fn_sig(inner)?);
                } else {
                    aliases.insert(name, rust_type(rhs));
                }
            }
            _ => {}
        }
    }
    // Structs are not `;`-terminated: find `#[repr(C)] pub struct NAME {` by lines.
    let lines: Vec<&str> = text.lines().collect();
    for (i, l) in lines.iter().enumerate() {
        if let Some(rest) = l.trim().strip_prefix("pub struct ") {
            let name = rest
                .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                .next()
                .unwrap()
                .to_string();
            if i == 0 || lines[i - 1].trim() != "#[repr(C)]" {
                return Err(format!("struct {name} is not #[repr(C)]"));
            }
            api.opaque.insert(name);
        }
    }
    for (name, target) in aliases {
        if target != "c_int" {
            return Err(format!("type {name} = {target}: enum typedefs are c_int"));
        }
        api.enum_types.insert(name);
    }
    Ok(api)
}

// ------------------------------------------------------------------------------------------
// The comparison
// ------------------------------------------------------------------------------------------
fn compare(header: &Api, rust: &Api) -> Vec<String> {
    let mut errs = Vec::new();
    for (name, hf) in &header.funcs {
        match rust.funcs.get(name) {
            None => errs.push(format!("{name}: in the header, not declared in lib.rs")),
            Some(rf) => {
                if hf.params.len() != rf.params.len() {
                    errs.push(format!(
                        "{name}: {} parameters in the header, {} in lib.rs",
                        hf.params.len(),
                        rf.params.len()
                    ));
                }
                for (i, (h, r)) in hf.params.iter().zip(&rf.params).enumerate() {
                    if h != r {
                        errs.push(format!(
                            "{name} parameter {i}: header `{}: {}`, lib.rs `{}: {}`",
                            h.name, h.ty, r.name, r.ty
                        ));
                    }
                }
                if hf.ret != rf.ret {
                    errs.push(format!(
                        "{name}: returns {} in the header, {} in lib.rs",
                        hf.ret, rf.ret
                    ));
                }
            }
        }
    }
    for name in rust.funcs.keys() {
        if !header.funcs.contains_key(name) {
            errs.push(format!("{name}: declared in lib.rs, not in the header"));
        }
    }
    for (name, (owner, v)) in &header.consts {
        match rust.consts.get(name) {
            None => errs.push(format!("{name} = {v}: in the header, not in lib.rs")),
            Some((ty, rv)) => {
                if rv != v {
                    errs.push(format!("{name}: {v} in the header, {rv} in lib.rs"));
                }
                let want_ty = if owner.is_empty() { "c_int" } else { owner.as_str() };
                if ty != want_ty {
                    errs.push(format!("{name}: of type {ty} in lib.rs; it belongs to {want_ty}"));
                }
            }
        }
    }
    for name in rust.consts.keys() {
        if !header.consts.contains_key(name) {
            errs.push(format!("{name}: a constant of lib.rs that the header does not have"));
        }
    }
    if header.enum_types != rust.enum_types {
        errs.push(format!(
            "enum typedefs differ: header {:?}, lib.rs {:?}",
            header.enum_types, rust.enum_types
        ));
    }
    if header.opaque != rust.opaque {
        errs.push(format!(
            "opaque handles differ: header {:?}, lib.rs {:?}",
            header.opaque, rust.opaque
        ));
    }
    if header.callbacks != rust.callbacks {
        errs.push(format!(
            "callback typedefs differ:\n  header {:?}\n  lib.rs {:?}",
            header.callbacks, rust.callbacks
        ));
    }
    errs
}

fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn rust_api() -> Api {
    let src = std::fs::read_to_string(manifest_dir().join("src/lib.rs")).expect("read src/lib.rs");
    parse_rust(&src).unwrap_or_else(|e| panic!("parsing lib.rs: {e}"))
}

fn headers() -> Vec<PathBuf> {
    let mut out = Vec::new();
    let repo = manifest_dir().join("../../../abi/include/fp4rl/fp4rl.h");
    if repo.exists() {
        out.push(repo);
    }
    let installed = PathBuf::from(env!("FP4RL_SYS_INCLUDE_DIR")).join("fp4rl/fp4rl.h");
    if installed.exists() {
        out.push(installed);
    }
    assert!(
        !out.is_empty(),
        "neither the repository's nor the installed fp4rl.h was found"
    );
    out
}

#[test]
fn declarations_match_every_header() {
    let rust = rust_api();
    for path in headers() {
        let src = std::fs::read_to_string(&path).unwrap();
        let header = parse_header(&src).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()));
        // Guard the parser itself: a parser that found nothing would compare nothing.
        assert!(
            header.funcs.len() >= 60,
            "only {} functions parsed from {}",
            header.funcs.len(),
            path.display()
        );
        assert!(
            header.consts.len() >= 90,
            "only {} constants parsed",
            header.consts.len()
        );
        assert_eq!(header.opaque.len(), 6); // context, tensor, quant_policy, model, rl_session, linear
        assert_eq!(header.callbacks.len(), 2); // fp4rl_reward_fn, fp4rl_release_fn
        let errs = compare(&header, &rust);
        assert!(
            errs.is_empty(),
            "lib.rs and {} differ:\n  {}",
            path.display(),
            errs.join("\n  ")
        );
        println!(
            "{}: {} functions, {} constants, {} enums, {} handles, {} callback type: all match",
            path.display(),
            header.funcs.len(),
            header.consts.len(),
            header.enum_types.len(),
            header.opaque.len(),
            header.callbacks.len()
        );
    }
}

// The checker must catch drift: feed it a header with one change of each kind.
#[test]
fn the_checker_catches_drift() {
    let rust = rust_api();
    let repo = headers().remove(0);
    let src = std::fs::read_to_string(repo).unwrap();
    let mutations: &[(&str, &str)] = &[
        ("FP4RL_ERR_SHAPE,", "FP4RL_ERR_SHAPE = 7,"),                 // a value
        ("int ordinal);", "int64_t ordinal);"),                       // a type
        ("const fp4rl_tensor *t, int i)", "fp4rl_tensor *t, int i)"), // constness
        (
            "int64_t seq_len, double *loss,",
            "int64_t seq_len, double *loss, int extra,",
        ), // a count
        (
            "FP4RL_API void fp4rl_tensor_destroy",
            "FP4RL_API void fp4rl_tensor_destroy2",
        ), // a name
        (
            "size_t completion_len, double *reward",
            "size_t completion_len, float *reward",
        ), // callback
        ("#define FP4RL_QP_COUNT 15", "#define FP4RL_QP_COUNT 16"),   // a define
        ("FP4RL_RESQ_BLOCK_50 = 4", "FP4RL_RESQ_BLOCK_50 = 4, FP4RL_RESQ_NEW = 5"), // a new one
    ];
    for (from, to) in mutations {
        assert!(
            src.contains(from),
            "mutation anchor `{from}` is gone from the header; update this test"
        );
        let changed = src.replacen(from, to, 1);
        let header = parse_header(&changed).unwrap();
        let errs = compare(&header, &rust);
        assert!(!errs.is_empty(), "changing `{from}` to `{to}` went unnoticed");
    }
}

// ------------------------------------------------------------------------------------------
// Against the linked library
// ------------------------------------------------------------------------------------------
use fp4rl_sys::*;

fn cstr(p: *const std::ffi::c_char) -> String {
    assert!(!p.is_null());
    unsafe { CStr::from_ptr(p) }.to_str().unwrap().to_string()
}

#[test]
fn every_function_links() {
    // Taking each address makes the linker resolve the symbol in the library; the list must be
    // exactly the header's functions.
    macro_rules! addr {
        ($f:ident) => {
            (stringify!($f), $f as *const () as usize)
        };
    }
    let table: &[(&str, usize)] = &[
        addr!(fp4rl_version_number),
        addr!(fp4rl_version_string),
        addr!(fp4rl_status_name),
        addr!(fp4rl_last_error),
        addr!(fp4rl_context_create),
        addr!(fp4rl_context_destroy),
        addr!(fp4rl_context_set_seed),
        addr!(fp4rl_context_get_rng),
        addr!(fp4rl_context_set_rng_offset),
        addr!(fp4rl_context_device),
        addr!(fp4rl_context_memory),
        addr!(fp4rl_context_reset_peak_memory),
        addr!(fp4rl_nccl_unique_id),
        addr!(fp4rl_context_create_distributed),
        addr!(fp4rl_context_get_rank),
        addr!(fp4rl_dtype_name),
        addr!(fp4rl_tensor_from_host),
        addr!(fp4rl_tensor_zeros),
        addr!(fp4rl_tensor_to_host),
        addr!(fp4rl_tensor_destroy),
        addr!(fp4rl_tensor_dtype),
        addr!(fp4rl_tensor_ndim),
        addr!(fp4rl_tensor_dim),
        addr!(fp4rl_tensor_numel),
        addr!(fp4rl_tensor_nbytes),
        addr!(fp4rl_tensor_context),
        addr!(fp4rl_tensor_quant_info),
        addr!(fp4rl_tensor_codes_to_host),
        addr!(fp4rl_tensor_scales_to_host),
        addr!(fp4rl_tensor_import_quantized),
        addr!(fp4rl_quant_policy_create),
        addr!(fp4rl_quant_policy_set),
        addr!(fp4rl_quant_policy_get),
        addr!(fp4rl_quant_policy_apply_preset),
        addr!(fp4rl_quant_policy_destroy),
        addr!(fp4rl_qparam_name),
        addr!(fp4rl_quantize),
        addr!(fp4rl_dequantize),
        addr!(fp4rl_tensor_transpose),
        addr!(fp4rl_matmul),
        addr!(fp4rl_quant_error),
        addr!(fp4rl_model_create),
        addr!(fp4rl_model_destroy),
        addr!(fp4rl_model_load),
        addr!(fp4rl_model_save),
        addr!(fp4rl_model_set_policy),
        addr!(fp4rl_model_set_hparam),
        addr!(fp4rl_model_get_hparam),
        addr!(fp4rl_model_get_info),
        addr!(fp4rl_model_logits),
        addr!(fp4rl_model_token_logprobs),
        addr!(fp4rl_model_compute_gradients),
        addr!(fp4rl_model_train_step),
        addr!(fp4rl_model_param_name),
        addr!(fp4rl_model_param_shape),
        addr!(fp4rl_model_get_param),
        addr!(fp4rl_model_get_grad),
        addr!(fp4rl_model_set_param),
        addr!(fp4rl_rl_session_create),
        addr!(fp4rl_rl_session_destroy),
        addr!(fp4rl_rl_session_set),
        addr!(fp4rl_rl_session_get),
        addr!(fp4rl_rl_session_set_stop_tokens),
        addr!(fp4rl_rl_session_step),
        addr!(fp4rl_rl_session_rollout),
        addr!(fp4rl_rl_session_num_completions),
        addr!(fp4rl_rl_session_completion),
        addr!(fp4rl_rl_session_set_rewards),
        addr!(fp4rl_rl_session_train),
        addr!(fp4rl_rl_session_metric),
        addr!(fp4rl_rl_session_metric_name),
        addr!(fp4rl_rl_session_metrics_json),
        addr!(fp4rl_rl_session_set_metrics_file),
        addr!(fp4rl_rl_session_step_count),
        addr!(fp4rl_rl_session_save),
        addr!(fp4rl_rl_session_load),
        addr!(fp4rl_model_from_pretrained),
        addr!(fp4rl_model_save_pretrained),
        addr!(fp4rl_rl_session_get_stop_tokens),
        addr!(fp4rl_tensor_wrap),
        addr!(fp4rl_tensor_data),
        addr!(fp4rl_context_set_stream),
        addr!(fp4rl_model_param_tensor),
        addr!(fp4rl_linear_create),
        addr!(fp4rl_linear_destroy),
        addr!(fp4rl_linear_forward),
        addr!(fp4rl_linear_backward),
    ];
    for (name, addr) in table {
        assert_ne!(*addr, 0, "{name} resolved to address 0");
    }
    let linked: BTreeSet<String> = table.iter().map(|(n, _)| n.to_string()).collect();
    assert_eq!(linked.len(), table.len(), "a function is listed twice");
    let rust: BTreeSet<String> = rust_api().funcs.keys().cloned().collect();
    assert_eq!(
        linked, rust,
        "this table and lib.rs's extern block list different functions"
    );
}

#[test]
fn version_of_the_linked_library() {
    let n = unsafe { fp4rl_version_number() };
    assert_eq!(
        n as i64, FP4RL_VERSION_NUMBER as i64,
        "linked library {n}, header {FP4RL_VERSION_NUMBER}"
    );
    let s = cstr(unsafe { fp4rl_version_string() });
    assert_eq!(
        s,
        format!("{FP4RL_VERSION_MAJOR}.{FP4RL_VERSION_MINOR}.{FP4RL_VERSION_PATCH}")
    );
    assert_eq!(
        s,
        env!("FP4RL_SYS_LIB_VERSION"),
        "pkg-config's version and the library's differ"
    );
}

#[test]
fn constant_values_have_the_library_names() {
    let statuses = [
        (FP4RL_OK, "FP4RL_OK"),
        (FP4RL_ERR_INVALID_ARGUMENT, "FP4RL_ERR_INVALID_ARGUMENT"),
        (FP4RL_ERR_SHAPE, "FP4RL_ERR_SHAPE"),
        (FP4RL_ERR_DTYPE, "FP4RL_ERR_DTYPE"),
        (FP4RL_ERR_UNSUPPORTED, "FP4RL_ERR_UNSUPPORTED"),
        (FP4RL_ERR_OUT_OF_MEMORY, "FP4RL_ERR_OUT_OF_MEMORY"),
        (FP4RL_ERR_DEVICE, "FP4RL_ERR_DEVICE"),
        (FP4RL_ERR_IO, "FP4RL_ERR_IO"),
        (FP4RL_ERR_CORRUPT, "FP4RL_ERR_CORRUPT"),
        (FP4RL_ERR_CALLBACK, "FP4RL_ERR_CALLBACK"),
        (FP4RL_ERR_INTERNAL, "FP4RL_ERR_INTERNAL"),
    ];
    for (v, name) in statuses {
        assert_eq!(cstr(unsafe { fp4rl_status_name(v) }), name);
    }
    assert_eq!(
        cstr(unsafe { fp4rl_status_name(FP4RL_ERR_INTERNAL + 1) }),
        "FP4RL_STATUS_UNKNOWN"
    );
    let dtypes = [
        (FP4RL_DTYPE_F32, "f32"),
        (FP4RL_DTYPE_BF16, "bf16"),
        (FP4RL_DTYPE_I32, "i32"),
        (FP4RL_DTYPE_MXFP4, "mxfp4"),
        (FP4RL_DTYPE_NVFP4, "nvfp4"),
        (FP4RL_DTYPE_HIF4, "hif4"),
        (FP4RL_DTYPE_MXFP8_E4M3, "mxfp8_e4m3"),
    ];
    for (v, name) in dtypes {
        assert_eq!(cstr(unsafe { fp4rl_dtype_name(v) }), name);
    }
    assert_eq!(cstr(unsafe { fp4rl_dtype_name(-1) }), "unknown");
    // every policy parameter below the count has a name, the count itself none
    for p in 0..FP4RL_QP_COUNT {
        assert!(!unsafe { fp4rl_qparam_name(p) }.is_null(), "qparam {p} has no name");
    }
    assert!(unsafe { fp4rl_qparam_name(FP4RL_QP_COUNT) }.is_null());
    assert_eq!(cstr(unsafe { fp4rl_qparam_name(FP4RL_QP_TILE_WEIGHT) }), "tile_weight");
}

#[test]
fn raw_calls_round_trip() {
    // A smoke test of the raw layer itself: create, use and free a context and a tensor.
    unsafe {
        let mut ctx: *mut fp4rl_context = std::ptr::null_mut();
        assert_eq!(fp4rl_context_create(&mut ctx, FP4RL_DEVICE_CPU, 0), FP4RL_OK);
        assert_eq!(fp4rl_context_device(ctx), FP4RL_DEVICE_CPU);
        let shape = [2i64, 3];
        let data = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        let mut t: *mut fp4rl_tensor = std::ptr::null_mut();
        assert_eq!(
            fp4rl_tensor_from_host(&mut t, ctx, FP4RL_DTYPE_F32, 2, shape.as_ptr(), data.as_ptr().cast()),
            FP4RL_OK
        );
        assert_eq!(fp4rl_tensor_context(t), ctx);
        assert_eq!(fp4rl_tensor_numel(t), 6);
        let mut back = [0f32; 6];
        assert_eq!(fp4rl_tensor_to_host(t, back.as_mut_ptr().cast(), 24), FP4RL_OK);
        assert_eq!(back, data);
        assert_eq!(fp4rl_tensor_to_host(t, back.as_mut_ptr().cast(), 23), FP4RL_ERR_SHAPE);
        assert!(cstr(fp4rl_last_error()).contains("fp4rl_tensor_to_host"));
        fp4rl_tensor_destroy(t);
        fp4rl_context_destroy(ctx);
        // every destroy accepts NULL
        fp4rl_tensor_destroy(std::ptr::null_mut());
        fp4rl_context_destroy(std::ptr::null_mut());
        fp4rl_quant_policy_destroy(std::ptr::null_mut());
        fp4rl_model_destroy(std::ptr::null_mut());
        fp4rl_rl_session_destroy(std::ptr::null_mut());
        assert_eq!(fp4rl_tensor_dtype(std::ptr::null()), -1);
        assert_eq!(fp4rl_context_device(std::ptr::null()), -1);
    }
}
