//! Integration tests of the analyzer: golden dumps of frozen files, the CLI's output and its errors.

mod c_calls;
mod cli;
mod counters;
mod diff;
mod export;
mod golden;
mod lines;
mod loops;
mod reports;
mod spans;
mod windows;

/// `testdata/` at the top of the workspace.
pub fn testdata(rel: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata").join(rel)
}

/// Writes to `path` a file of one code object `f` (synthetic.py, id 1, every code unit on `line`) and
/// `events` on thread 7, closed with a trailer 50 ticks after the last event.
pub fn synthetic_trace(
    path: &std::path::Path,
    header: &ocular_format::Header,
    bytecode: Vec<u8>,
    line: i32,
    events: &[ocular_format::RawEvent],
) {
    use ocular_format::{CodeObject, Position, Trailer, Writer};
    let code = CodeObject {
        id: 1,
        name: "f".into(),
        qualname: "f".into(),
        filename: "synthetic.py".into(),
        first_line: 1,
        flags: 0,
        linetable: Vec::new(),
        positions: vec![Position { line, end_line: line, column: 0, end_column: 1 }; bytecode.len() / 2],
        bytecode,
    };
    let name = path.display().to_string();
    let mut w = Writer::new(std::fs::File::create(path).unwrap(), &name, header, Default::default()).unwrap();
    w.code_objects(&[code]).unwrap();
    w.events(7, events).unwrap();
    let end_ticks = events.last().map_or(0, |e| e.ticks.get()) + 50;
    let events = events.len() as u64;
    w.finish(Trailer { end_unix_ns: 0, end_monotonic_ns: 0, end_ticks, events, lost: 0, chunks: 2 }).unwrap();
}
