//! `specialize`: in the hottest loops and functions, the instructions CPython left generic although this
//! Python has specialized forms for them, weighted by the time spent there, with the likely cause.
//!
//! What it reads: each code object's base bytecode (FORMAT.md 6.1) and its specialized bytecode when the
//! recording stopped (the snapshot, 6.4), named through the file's own opcode table (4.2), so every Python
//! version's names and numbering come from the recording itself. A family is a base opcode and the opcodes
//! whose base it is (`BINARY_OP` and `BINARY_OP_ADD_INT`, `BINARY_OP_ADD_FLOAT`, ...), as
//! [`specialization`] matches them.
//!
//! What it cannot tell: the snapshot keeps opcodes, not the interpreter's adaptive counters (the writer
//! zeroes inline caches), so an instruction found generic at stop may never have specialized, or may have
//! de-specialized after its guards kept failing; both are reported as "generic at stop". Likewise an
//! instruction found specialized may still miss its guards part of the time.

use crate::analysis::{instructions, specialization, Analysis, LoopStats};
use ocular_format::{CodeObject, Header, Mode, OpcodeTable};
use rustc_hash::FxHashSet as HashSet;
use serde::Serialize;

/// Executions before CPython first tries to specialize an instruction (its warm-up counter starts at 1 in
/// 3.12 to 3.14): an instruction that ran fewer times is generic because it is cold, not because of its
/// operands, and is not reported.
pub const MIN_EXECUTIONS: u64 = 2;

/// Families whose specialized forms say nothing about the program's types or objects: entry checks
/// (`RESUME_CHECK`), the JIT's backward jumps, constants' reference counting, 3.12's superinstructions
/// (`LOAD_FAST__LOAD_FAST`). Skipped.
const NOT_TYPE_DRIVEN: &[&str] = &["RESUME", "JUMP_BACKWARD", "LOAD_CONST", "LOAD_FAST", "STORE_FAST"];

/// The likely causes of a generic instruction, by family: what each family's specialized forms need,
/// from CPython's specializer (Python/specialize.c), so that what the program does otherwise is named.
const CAUSES: &[(&str, &str)] = &[
    (
        "BINARY_OP",
        "operand types vary or are not both int, both float or both str (for +): e.g. mixed int and float, \
         Decimal, Fraction, numpy scalars or arrays, list or tuple concatenation",
    ),
    (
        "BINARY_SUBSCR",
        "the container is not a list, tuple or str indexed by a small int, a dict, or a class with a Python \
         __getitem__, or its type varies: e.g. a slice, a negative index, numpy arrays, bytes",
    ),
    (
        "STORE_SUBSCR",
        "the container is not a list indexed by an int or a dict, or its type varies: e.g. numpy arrays, \
         bytearray, a slice, a class with __setitem__",
    ),
    (
        "LOAD_ATTR",
        "the attribute is on a class with __getattr__ or __getattribute__ or a descriptor without a fast path, \
         or the instances vary in type or shape (attributes added in a different order, an instance __dict__ \
         grown too large), or a module attribute changed",
    ),
    (
        "STORE_ATTR",
        "no __slots__ or inline values to store into: a class with __setattr__ or a property setter, instances \
         of varying types, or an instance __dict__ that was materialized (vars(obj), many attributes)",
    ),
    (
        "LOAD_GLOBAL",
        "the globals or builtins dict was modified during the run (names added or deleted change its keys' \
         version), or is not a plain dict with str keys",
    ),
    (
        "CALL",
        "the callable is not a Python function, type or builtin with a fast path, or varies at this site: e.g. a \
         bound method through a descriptor, an object with __call__, a class with a metaclass __call__, a \
         Python function called with *args or **kwargs",
    ),
    (
        "CALL_KW",
        "a call with keywords whose callable is not a plain Python function or bound method, or varies at this \
         site",
    ),
    (
        "COMPARE_OP",
        "operand types vary or are not both int, both float or both str (str: == and != only): e.g. int against \
         float, comparisons with None, rich comparison methods",
    ),
    (
        "FOR_ITER",
        "iterating something other than a list, tuple, range or generator (e.g. dict views, set, enumerate, \
         zip, a file, a class with __iter__), or the iterable's type varies",
    ),
    ("UNPACK_SEQUENCE", "the value is not a tuple or list of that length, or its type varies"),
    (
        "CONTAINS_OP",
        "the container is not a set, frozenset or dict (`in` a list, tuple or str scans it), or its type varies",
    ),
    (
        "TO_BOOL",
        "the tested value's type varies, or is not a bool, int, str, list, None or an instance of a class without \
         __bool__ and __len__ (e.g. float, dict, tuple)",
    ),
    ("SEND", "sending into something other than a generator or coroutine (e.g. an awaitable with __await__)"),
    ("LOAD_SUPER_ATTR", "super is not the builtin super, or it is called in a form without a fast path"),
];

/// `BINARY_OP`'s argument (`NB_*`, the same numbering from 3.12 to 3.15) as the operator.
const OPERATORS: [&str; 27] = [
    "+", "&", "//", "<<", "@", "*", "%", "|", "**", ">>", "-", "/", "^", "+=", "&=", "//=", "<<=", "@=", "*=", "%=",
    "|=", "**=", ">>=", "-=", "/=", "^=", "[]",
];

/// What became of one instruction, comparing its base opcode with the snapshot's at stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// It held a specialized form of its base: fine.
    Specialized(u8),
    /// Its family has specialized forms in this Python, and it held the base form.
    Generic,
    /// Its family has no specialized form here, or none that depends on the program (`NOT_TYPE_DRIVEN`),
    /// or (`BINARY_OP`) none for its operator.
    NotSpecializable,
    /// It was still `INSTRUMENTED_*` at stop: its specialization is hidden.
    Instrumented,
    /// No snapshot of its code, or the snapshot's opcode is not a form of the base (damaged data).
    Unknown,
}

/// The specialized forms of `base` in `table`: opcodes whose base it is, instrumented ones aside.
pub fn family(table: &OpcodeTable, base: u8) -> Vec<u8> {
    (0..=255u8)
        .filter(|&op| {
            op != base && table.base.get(op as usize) == Some(&base) && !table.name(op).starts_with("INSTRUMENTED_")
        })
        .collect()
}

/// Classifies the instruction whose base opcode is `base` and argument `oparg`, given the opcode found at
/// its offset in the snapshot (`None`: no snapshot).
pub fn classify(header: &Header, base: u8, oparg: u8, at_stop: Option<u8>) -> Class {
    let table = &header.opcodes;
    let name = table.name(base);
    let forms = family(table, base);
    if forms.is_empty() || NOT_TYPE_DRIVEN.contains(&name.as_ref()) {
        return Class::NotSpecializable;
    }
    if name == "BINARY_OP" && !operator_specializable(table, &forms, oparg) {
        return Class::NotSpecializable;
    }
    let Some(at_stop) = at_stop else { return Class::Unknown };
    match specialization(header, base, at_stop) {
        Ok(op) if op == base => Class::Generic,
        Ok(op) => Class::Specialized(op),
        Err(true) => Class::Instrumented,
        Err(false) => Class::Unknown,
    }
}

/// Whether this Python specializes `BINARY_OP` with argument `oparg`, from the family's names: `+ - *`
/// (and their in-place forms) always; `/ | & ^` where `BINARY_OP_EXTEND` exists (3.14+); subscripts where
/// `BINARY_OP_SUBSCR_*` forms exist (3.14+, where `BINARY_SUBSCR` became `BINARY_OP` `[]`).
fn operator_specializable(table: &OpcodeTable, forms: &[u8], oparg: u8) -> bool {
    let has = |prefix: &str| forms.iter().any(|&op| table.name(op).starts_with(prefix));
    match OPERATORS.get(oparg as usize).map(|s| s.trim_end_matches('=')) {
        Some("+" | "-" | "*") => true,
        Some("/" | "|" | "&" | "^") => has("BINARY_OP_EXTEND"),
        Some("[]") => has("BINARY_OP_SUBSCR"),
        Some(_) => false,
        None => true,
    }
}

/// The likely cause of a generic instruction of family `base`.
pub fn cause(table: &OpcodeTable, base: &str) -> String {
    let known = CAUSES.iter().find(|(f, _)| *f == base).map(|(_, c)| c.to_string());
    let mut text = known.unwrap_or_else(|| "no cause known for this family".into());
    let number = table.names.iter().position(|n| n == base);
    let non_py =
        number.is_some_and(|b| family(table, b as u8).iter().any(|&op| table.name(op) == "CALL_NON_PY_GENERAL"));
    if base == "CALL" && non_py {
        // 3.13+ specializes any callable that is not a Python function: generic means it varies.
        text.push_str(
            "; this Python has CALL_NON_PY_GENERAL for any other callable, so most likely the callable varies \
             between calls at this site",
        );
    }
    text
}

/// One generic instruction.
#[derive(Debug, Serialize)]
pub struct Generic {
    /// Qualified name of its function.
    pub function: String,
    /// Source file.
    pub file: String,
    /// Source line, -1 if none.
    pub line: i32,
    /// Byte offset in the code object.
    pub offset: u32,
    /// Base opcode name.
    pub base: String,
    /// `BINARY_OP`'s operator (`+`, `*=`, ...), else absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub operator: Option<String>,
    /// Opcode name in the snapshot at stop (the base itself: that is what generic means).
    pub at_stop: String,
    /// Always "generic at stop": the snapshot cannot tell never specialized from de-specialized (module docs).
    pub status: String,
    /// Estimated time spent at this instruction, ns (see `SpecializeReport::weighting`).
    pub weight_ns: f64,
    /// "loop": measured in the loop's recorded blocks; "even share": the function's time outside its loops
    /// shared evenly (a rough estimate: a C call's time falls on every instruction alike).
    pub weight_kind: String,
    /// `weight_ns` as a share of the block's time (0..1).
    pub share: f64,
    /// Executions recorded (in a loop: its measured visits); outside loops, the function's recorded calls:
    /// an upper bound, as an instruction on a path not taken (an `else`, an exception handler) never ran,
    /// except in calls mode, which records no loops (the instruction may have run in one).
    pub executions: u64,
    /// The likely cause, from the family (see `cause`).
    pub cause: String,
    /// The family's specialized forms in this Python: what it could have become.
    pub forms: Vec<String>,
}

/// A hot loop or a hot function, and what became of its instructions.
#[derive(Debug, Serialize)]
pub struct Block {
    /// "loop" or "function".
    pub kind: String,
    /// The process that ran it.
    pub pid: u32,
    /// Qualified name of the function.
    pub function: String,
    /// Source file.
    pub file: String,
    /// First and last source line of the instructions walked.
    pub first_line: i32,
    /// See `first_line`.
    pub last_line: i32,
    /// A loop: its head and backward jump's offsets (absent for a function).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offsets: Option<(u32, u32)>,
    /// A loop: its recorded iterations (absent for a function).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iterations: Option<u64>,
    /// A loop: its time, as `hot` gives it (callees included); a function: its exclusive time. ns.
    pub total_ns: f64,
    /// Instructions walked: the loop body, or the whole function.
    pub instructions: u32,
    /// Of those, holding a specialized form at stop.
    pub specialized: u32,
    /// Generic at stop, reported in `generic` (or in another block: `listed_elsewhere`).
    pub generic_count: u32,
    /// Still instrumented at stop: specialization hidden.
    pub instrumented: u32,
    /// Without specialized forms that depend on the program (see `Class::NotSpecializable`).
    pub unspecializable: u32,
    /// Not classified: no snapshot of the code, or a snapshot opcode of another family (damaged data).
    pub unknown: u32,
    /// Generic, but ran fewer than [`MIN_EXECUTIONS`] times as far as recorded: cold, not reported.
    pub cold: u32,
    /// Generic ones listed with another block instead: an inner loop's, or for a function, its loop's.
    pub listed_elsewhere: u32,
    /// The generic instructions, heaviest first.
    pub generic: Vec<Generic>,
}

/// The report.
#[derive(Debug, Serialize)]
pub struct SpecializeReport {
    /// The trace.
    pub file: String,
    /// Python version that was recorded.
    pub python: String,
    /// Recording mode.
    pub mode: String,
    /// How `weight_ns` is estimated.
    pub weighting: String,
    /// What "generic at stop" can and cannot say, and what the mode hides.
    pub notes: Vec<String>,
    /// Hot loops first (the `hot` ranking), then hot functions by exclusive time.
    pub blocks: Vec<Block>,
    /// A run of several processes: how many (0 for one); each block names its process.
    #[serde(skip_serializing_if = "is_zero")]
    pub processes: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// How weights are estimated, for the report and `--help`.
pub const WEIGHTING: &str = "in a loop, the instruction's share of the loop's recorded time (its block's time between \
     two events of the frame, spread evenly over the block's instructions, callees excluded), scaled up by the time \
     the loop ran after the threshold stopped recording it; outside loops, the function's exclusive time left after \
     its loops, shared evenly over its other instructions. Estimates: they rank, they do not measure one instruction";

/// The report for one process: its `top` hottest loops and `top` hottest functions.
pub fn report(a: &Analysis, file: &str, top: usize) -> SpecializeReport {
    let header = a.header.as_ref().expect("analysis has a header");
    let mut blocks = Vec::new();
    // Instructions listed once: in the innermost hot loop that holds them (outer loops' bodies hold their
    // inner loops').
    let mut listed: HashSet<(u32, u32)> = HashSet::default();
    let mut loops: Vec<_> = crate::hot::ranked(a).into_iter().take(top).collect();
    loops.sort_by_key(|(&(id, head), s)| (std::cmp::Reverse(head), id, s.end));
    let mut loop_blocks = Vec::new();
    for (&(id, head), s) in loops {
        let Some(co) = a.code.get(&id) else { continue };
        let offsets = instructions(co, header, head, s.end);
        let total = a.ns(s.ticks + s.tail_ticks);
        let mut b = walk(a, header, co, &offsets, "loop", total, &mut listed);
        b.offsets = Some((head, s.end));
        b.iterations = Some(s.iterations);
        loop_blocks.push(b);
    }
    loop_blocks.sort_by(|x, y| y.total_ns.total_cmp(&x.total_ns).then(y.iterations.cmp(&x.iterations)));
    blocks.extend(loop_blocks);
    let mut funcs: Vec<_> = a.functions.iter().filter(|(_, f)| f.exclusive > 0.0).collect();
    funcs.sort_by(|x, y| y.1.exclusive.total_cmp(&x.1.exclusive).then(x.0.cmp(y.0)));
    for (&id, f) in funcs.into_iter().take(top) {
        let Some(co) = a.code.get(&id) else { continue };
        let offsets = instructions(co, header, 0, u32::MAX);
        blocks.push(walk(a, header, co, &offsets, "function", a.ns(f.exclusive.max(0.0)), &mut listed));
    }
    SpecializeReport {
        file: file.into(),
        python: header.python_version.clone(),
        mode: mode_name(header.options.mode).into(),
        weighting: WEIGHTING.into(),
        notes: notes(a, header),
        blocks,
        processes: 0,
    }
}

/// The report of a run of several processes: each process's blocks, loops and functions each merged by
/// time and cut at `top`.
pub fn report_run(analyses: &[&Analysis], file: &str, top: usize) -> SpecializeReport {
    let mut reports: Vec<SpecializeReport> = analyses.iter().map(|a| report(a, file, top)).collect();
    let mut first = reports.remove(0);
    for r in reports {
        first.blocks.extend(r.blocks);
        for n in r.notes {
            if !first.notes.contains(&n) {
                first.notes.push(n);
            }
        }
    }
    let (mut loops, mut funcs): (Vec<Block>, Vec<Block>) = first.blocks.drain(..).partition(|b| b.kind == "loop");
    for v in [&mut loops, &mut funcs] {
        v.sort_by(|x, y| y.total_ns.total_cmp(&x.total_ns));
        v.truncate(top);
    }
    first.blocks = loops.into_iter().chain(funcs).collect();
    first.processes = analyses.len();
    first
}

fn mode_name(m: Mode) -> &'static str {
    match m {
        Mode::Precise => "precise",
        Mode::Adaptive => "adaptive",
        Mode::Calls => "calls",
    }
}

fn notes(a: &Analysis, header: &Header) -> Vec<String> {
    let mut out =
        vec!["generic at stop: the instruction held its base opcode when recording stopped although this Python has \
         specialized forms for it; whether it never specialized or de-specialized cannot be told (the snapshot \
         keeps opcodes, not the interpreter's adaptive counters), and one found specialized may still miss its \
         guards part of the time"
            .to_string()];
    if a.snapshots.is_empty() {
        out.push(
            "the file has no bytecode snapshot (a recording that did not stop cleanly, or a flight recorder's dump): \
             nothing can be classified"
                .into(),
        );
    }
    match header.options.mode {
        Mode::Adaptive => out.push(
            "adaptive mode: FOR_ITER and conditional jumps that were still recorded at stop are still instrumented \
             (their specialization hidden); record with a threshold (the default 500) so that hot ones are released \
             and re-specialize"
                .into(),
        ),
        Mode::Precise => out.push(
            "precise mode: every instruction still recorded at stop is instrumented, its specialization hidden; \
             with a threshold hot ones are released and re-specialize, or record in adaptive or calls mode"
                .into(),
        ),
        Mode::Calls => out.push("calls mode: no loops are recorded, so functions only".into()),
    }
    out
}

/// Where the instruction at `off` of code `id` spent its time: the innermost recorded loop of the code
/// that holds it, with that loop's scale-up for its unrecorded time.
fn innermost_loop(a: &Analysis, id: u32, off: u32) -> Option<(&LoopStats, f64)> {
    let (_, s) = a
        .loops
        .iter()
        .filter(|(&(c, head), s)| c == id && head <= off && off <= s.end && s.iterations > 0)
        .max_by_key(|(&(_, head), _)| head)?;
    // Recorded iterations' time holds callees; the tail scales up by the share the recording saw.
    let scale = if s.ticks > 0.0 { (s.ticks + s.tail_ticks) / s.ticks } else { 1.0 };
    Some((s, scale))
}

/// Classifies and weighs the instructions at `offsets` of `co`, as a block of kind `kind` whose time is
/// `total_ns`; instructions in `listed` were reported by an earlier block, and those reported here join it.
fn walk(
    a: &Analysis,
    header: &Header,
    co: &CodeObject,
    offsets: &[u32],
    kind: &str,
    total_ns: f64,
    listed: &mut HashSet<(u32, u32)>,
) -> Block {
    let table = &header.opcodes;
    let snap = a.snapshots.get(&co.id);
    let calls = a.functions.get(&co.id).map_or(0, |f| f.observed_calls);
    let mut b = Block {
        kind: kind.into(),
        pid: header.pid,
        function: co.qualname.clone(),
        file: co.filename.clone(),
        first_line: i32::MAX,
        last_line: i32::MIN,
        offsets: None,
        iterations: None,
        total_ns,
        instructions: offsets.len() as u32,
        specialized: 0,
        generic_count: 0,
        instrumented: 0,
        unspecializable: 0,
        unknown: 0,
        cold: 0,
        listed_elsewhere: 0,
        generic: Vec::new(),
    };
    // Per instruction: offset, line, base opcode, argument, class, and in a recorded loop (ns, visits).
    let mut rows = Vec::new();
    let mut in_loops_ns = 0.0;
    let mut outside = 0u32;
    for &off in offsets {
        let op = co.bytecode[off as usize];
        let oparg = co.bytecode.get(off as usize + 1).copied().unwrap_or(0);
        let line = co.positions.get(off as usize / 2).map_or(-1, |p| p.line);
        if line >= 0 {
            b.first_line = b.first_line.min(line);
            b.last_line = b.last_line.max(line);
        }
        let base = table.base.get(op as usize).copied().unwrap_or(op);
        let at_stop = snap.and_then(|s| s.get(off as usize).copied());
        let class = classify(header, base, oparg, at_stop);
        let measured = innermost_loop(a, co.id, off).map(|(s, scale)| {
            let (ticks, visits) = s.spent_at(off).unwrap_or((0.0, 0));
            (a.ns(ticks * scale), visits)
        });
        match measured {
            Some((ns, _)) => in_loops_ns += ns,
            None => outside += 1,
        }
        rows.push((off, line, base, oparg, class, measured));
    }
    if b.first_line == i32::MAX {
        (b.first_line, b.last_line) = (co.first_line as i32, co.first_line as i32);
    }
    // A function's time outside its loops, shared evenly over the instructions there.
    let even = if outside > 0 { (total_ns - in_loops_ns).max(0.0) / outside as f64 } else { 0.0 };
    for (off, line, base, oparg, class, measured) in rows {
        match class {
            Class::Specialized(_) => b.specialized += 1,
            Class::Instrumented => b.instrumented += 1,
            Class::NotSpecializable => b.unspecializable += 1,
            Class::Unknown => b.unknown += 1,
            Class::Generic => {
                b.generic_count += 1;
                let (weight_ns, executions) = measured.unwrap_or((even, calls));
                let weight_kind = if measured.is_some() { "loop" } else { "even share" };
                // Calls mode records no loops: an instruction of a function called once may have run in
                // one, so its calls do not bound its executions.
                let bounded = measured.is_some() || header.options.mode != Mode::Calls;
                if bounded && executions < MIN_EXECUTIONS {
                    b.cold += 1;
                    continue;
                }
                if !listed.insert((co.id, off)) {
                    b.listed_elsewhere += 1;
                    continue;
                }
                let name = table.name(base).into_owned();
                b.generic.push(Generic {
                    function: co.qualname.clone(),
                    file: co.filename.clone(),
                    line,
                    offset: off,
                    operator: (name == "BINARY_OP").then(|| OPERATORS.get(oparg as usize).unwrap_or(&"?").to_string()),
                    at_stop: name.clone(),
                    status: "generic at stop".into(),
                    weight_ns,
                    weight_kind: weight_kind.into(),
                    share: if total_ns > 0.0 { weight_ns / total_ns } else { 0.0 },
                    executions,
                    cause: cause(table, &name),
                    forms: family(table, base).into_iter().map(|op| table.name(op).into_owned()).collect(),
                    base: name,
                });
            }
        }
    }
    b.generic.sort_by(|x, y| y.weight_ns.total_cmp(&x.weight_ns).then(x.offset.cmp(&y.offset)));
    b
}

/// "1.234 ms", "56.7 us", "890 ns".
fn time(ns: f64) -> String {
    if ns >= 1e6 {
        format!("{:.3} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.1} us", ns / 1e3)
    } else {
        format!("{ns:.0} ns")
    }
}

impl std::fmt::Display for SpecializeReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "Specialization at stop: {} (Python {}, {} mode)", self.file, self.python, self.mode)?;
        writeln!(f, "  weight: {}", self.weighting)?;
        for n in &self.notes {
            writeln!(f, "  {n}")?;
        }
        if self.blocks.is_empty() {
            writeln!(f, "\n  no loops or functions recorded")?;
        }
        let mut counts = [0usize; 2];
        for b in &self.blocks {
            let k = usize::from(b.kind == "function");
            counts[k] += 1;
            writeln!(f)?;
            let pid = if self.processes > 0 { format!(" (pid {})", b.pid) } else { String::new() };
            match (b.offsets, b.iterations) {
                (Some((head, end)), Some(n)) => writeln!(
                    f,
                    "loop #{} in {}{pid}  {}:{}-{} (offsets {head}-{end}), {n} iterations, {} with callees",
                    counts[k],
                    b.function,
                    b.file,
                    b.first_line,
                    b.last_line,
                    time(b.total_ns)
                )?,
                _ => writeln!(
                    f,
                    "function #{} {}{pid}  {}:{}-{}, {} exclusive",
                    counts[k],
                    b.function,
                    b.file,
                    b.first_line,
                    b.last_line,
                    time(b.total_ns)
                )?,
            }
            let mut parts = vec![format!("{} specialized", b.specialized)];
            let shown = b.generic_count - b.cold - b.listed_elsewhere;
            parts.push(format!("{shown} generic"));
            if b.listed_elsewhere > 0 {
                let with = if b.kind == "loop" { "an inner loop" } else { "its loops" };
                parts.push(format!("{} generic listed with {with}", b.listed_elsewhere));
            }
            if b.cold > 0 {
                parts.push(format!("{} generic but cold (ran < {MIN_EXECUTIONS} times)", b.cold));
            }
            if b.instrumented > 0 {
                parts.push(format!("{} still instrumented at stop", b.instrumented));
            }
            parts.push(format!("{} without specialized forms", b.unspecializable));
            if b.unknown > 0 {
                parts.push(format!("{} not in the snapshot", b.unknown));
            }
            writeln!(f, "   {} instructions: {}", b.instructions, parts.join(", "))?;
            // A family's cause in full once per block; then by name.
            let mut told: Vec<&str> = Vec::new();
            for g in &b.generic {
                let op = g.operator.as_ref().map(|o| format!(" ({o})")).unwrap_or_default();
                let file = g.file.rsplit('/').next().unwrap_or(&g.file);
                // Outside loops no instruction's executions are recorded: the calls bound them, and an
                // instruction on a path not taken (an `else`, an exception handler) never ran at all.
                let (how, runs) = if g.weight_kind == "even share" && self.mode == "calls" {
                    (", even share", format!("its function ran {} times (calls mode records no loops)", g.executions))
                } else if g.weight_kind == "even share" {
                    (", even share", format!("at most {} executions (its path may not have run)", g.executions))
                } else {
                    ("", format!("{} executions", g.executions))
                };
                writeln!(
                    f,
                    "   {}  {file}:{}  offset {}  {}{op} -> {} ({})  ~{} ({:.1}% of the {}{how}), {runs}",
                    g.function,
                    g.line,
                    g.offset,
                    g.base,
                    g.at_stop,
                    g.status,
                    time(g.weight_ns),
                    g.share * 100.0,
                    b.kind,
                )?;
                if told.contains(&g.base.as_str()) {
                    writeln!(f, "      likely cause: as for {} above", g.base)?;
                } else {
                    writeln!(f, "      likely cause: {}", g.cause)?;
                    told.push(&g.base);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 3.13-like table: BINARY_OP with two forms, LOAD_ATTR with one, RESUME with RESUME_CHECK, an
    /// instrumented FOR_ITER, and a STORE_FAST without forms.
    fn header() -> Header {
        let mut h = ocular_format::testing::header();
        let t = &mut h.opcodes;
        let mut set = |op: usize, name: &str, base: usize| {
            t.names[op] = name.into();
            t.base[op] = base as u8;
        };
        set(45, "BINARY_OP", 45);
        set(150, "BINARY_OP_ADD_INT", 45);
        set(151, "BINARY_OP_ADD_FLOAT", 45);
        set(80, "LOAD_ATTR", 80);
        set(160, "LOAD_ATTR_INSTANCE_VALUE", 80);
        set(10, "STORE_FAST", 10);
        set(149, "RESUME", 149);
        set(161, "RESUME_CHECK", 149);
        set(93, "FOR_ITER", 93);
        set(236, "INSTRUMENTED_FOR_ITER", 93);
        set(100, "CALL", 100);
        set(162, "CALL_NON_PY_GENERAL", 100);
        h
    }

    #[test]
    fn classification_follows_the_files_own_families() {
        let h = header();
        assert_eq!(classify(&h, 45, 0, Some(150)), Class::Specialized(150));
        assert_eq!(classify(&h, 45, 13, Some(45)), Class::Generic, "+= stayed generic");
        // No specialized form for // before BINARY_OP_EXTEND: not reported, whatever the snapshot holds.
        assert_eq!(classify(&h, 45, 2, Some(45)), Class::NotSpecializable);
        assert_eq!(classify(&h, 80, 0, Some(80)), Class::Generic);
        assert_eq!(classify(&h, 80, 0, None), Class::Unknown, "no snapshot");
        assert_eq!(classify(&h, 10, 0, Some(10)), Class::NotSpecializable, "no family");
        assert_eq!(classify(&h, 149, 0, Some(149)), Class::NotSpecializable, "RESUME is not about types");
        assert_eq!(classify(&h, 93, 0, Some(236)), Class::Instrumented);
        assert_eq!(classify(&h, 45, 0, Some(160)), Class::Unknown, "a form of another family");
        assert_eq!(family(&h.opcodes, 93), vec![194], "FOR_ITER_RANGE, not INSTRUMENTED_FOR_ITER");
    }

    #[test]
    fn extend_and_subscript_forms_make_more_operators_specializable() {
        let mut h = header();
        assert_eq!(classify(&h, 45, 11, Some(45)), Class::NotSpecializable, "/ without BINARY_OP_EXTEND");
        assert_eq!(classify(&h, 45, 26, Some(45)), Class::NotSpecializable, "[] without BINARY_OP_SUBSCR_*");
        h.opcodes.names[152] = "BINARY_OP_EXTEND".into();
        h.opcodes.base[152] = 45;
        h.opcodes.names[153] = "BINARY_OP_SUBSCR_LIST_INT".into();
        h.opcodes.base[153] = 45;
        assert_eq!(classify(&h, 45, 11, Some(45)), Class::Generic);
        assert_eq!(classify(&h, 45, 26, Some(45)), Class::Generic);
        assert_eq!(classify(&h, 45, 8, Some(45)), Class::NotSpecializable, "** has no form in any version");
    }

    #[test]
    fn causes_name_the_family_and_what_this_python_has() {
        let h = header();
        assert!(cause(&h.opcodes, "BINARY_OP").contains("mixed int and float"));
        assert!(cause(&h.opcodes, "LOAD_ATTR").contains("__getattr__"));
        assert!(cause(&h.opcodes, "CALL").contains("CALL_NON_PY_GENERAL"));
        assert_eq!(cause(&h.opcodes, "NOPE"), "no cause known for this family");
    }
}
