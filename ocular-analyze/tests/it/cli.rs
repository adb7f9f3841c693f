//! The binary as a user runs it: output, exit codes and error messages.

use crate::testdata;
use std::process::{Command, Output};

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ocular-analyze")).args(args).output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn info_json_counts_the_fixture() {
    let f = testdata("v1.0/synthetic.ocl");
    let out = run(&["info", "--json", f.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["events"], 83);
    assert_eq!(v["events_by_kind"]["BRANCH"], 40);
    assert_eq!(v["events_by_kind"]["JUMP"], 37);
    assert_eq!(v["threads"][1]["name"], "worker-1");
    assert_eq!(v["threads"][1]["events"], 27);
    assert_eq!(v["lost_events"], 3);
    assert_eq!(v["closed_cleanly"], true);
    assert_eq!(v["mode"], "adaptive");
}

#[test]
fn info_text_says_how_the_file_was_closed() {
    let f = testdata("v1.0/synthetic.ocl");
    let out = run(&["info", f.to_str().unwrap()]);
    let s = text(&out.stdout);
    assert!(s.contains("events        83 in 10 chunks"), "{s}");
    assert!(s.ends_with("closed        cleanly\n"), "{s}");
}

#[test]
fn a_missing_file_is_named_with_exit_code_2() {
    let out = run(&["info", "/nonexistent/run.ocl"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        text(&out.stderr),
        "ocular-analyze: error: /nonexistent/run.ocl: No such file or directory (os error 2)\n"
    );
}

#[test]
fn a_foreign_file_is_refused_by_name() {
    let out = run(&["dump", concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml")]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(err.contains("Cargo.toml is not an Ocular trace: bytes at offset 0 are 5b 70 61 63 6b 61 67 65"), "{err}");
}

#[test]
fn a_truncated_file_is_read_up_to_its_last_whole_chunk_with_a_warning() {
    let bytes = std::fs::read(testdata("v1.0/synthetic.ocl")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cut = dir.path().join("cut.ocl");
    std::fs::write(&cut, &bytes[..1300]).unwrap();
    let out = run(&["info", "--json", cut.to_str().unwrap()]);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["events"], 0);
    assert_eq!(v["closed_cleanly"], false);
    let err = text(&out.stderr);
    assert!(err.contains("cut.ocl: incomplete chunk at offset 1237 (63 bytes) ignored"), "{err}");
    assert!(err.contains("no trailer: the recording did not close cleanly"), "{err}");
}

#[test]
fn a_corrupt_file_names_the_offset_and_salvage_skips_it() {
    let mut bytes = std::fs::read(testdata("v1.0/synthetic.ocl")).unwrap();
    bytes[1237 + 70] ^= 0xff; // inside the first EVENTS chunk's payload
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.ocl");
    std::fs::write(&bad, &bytes).unwrap();
    let out = run(&["info", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("bad.ocl: corrupt chunk at offset 1237: CRC mismatch"), "{}", text(&out.stderr));
    let out = run(&["info", "--json", "--salvage", bad.to_str().unwrap()]);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["events"], 83 - 43);
    assert!(text(&out.stderr).contains("skipped"), "{}", text(&out.stderr));
}

/// A copy of the synthetic fixture in a fresh directory (removed when dropped), whose first EVENTS chunk has
/// a damaged payload under a recomputed CRC: only decoding finds it, so exports fail after they have started
/// writing. Returns the directory and the file.
fn undecodable_events() -> (tempfile::TempDir, std::path::PathBuf) {
    let mut bytes = std::fs::read(testdata("v1.0/synthetic.ocl")).unwrap();
    let at = 1237; // the first EVENTS chunk
    assert_eq!(&bytes[at..at + 6], b"OCCH\x02\x00");
    let len = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap()) as usize;
    bytes[at + 56..at + 56 + len].fill(0x41);
    let mut crc = crc32fast::Hasher::new();
    crc.update(&bytes[at..at + 52]);
    crc.update(&bytes[at + 56..at + 56 + len]);
    bytes[at + 52..at + 56].copy_from_slice(&crc.finalize().to_le_bytes());
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.ocl");
    std::fs::write(&bad, &bytes).unwrap();
    (dir, bad)
}

const UNDECODABLE: &str = "bad.ocl: corrupt chunk at offset 1237: zstd payload does not decompress";

#[test]
fn a_failed_export_leaves_no_file() {
    let (dir, bad) = undecodable_events();
    for (cmd, name) in [
        (&["export", "--perfetto"][..], "out.json"),
        (&["export", "--perfetto"], "out.pftrace"),
        (&["flamegraph"], "out.svg"),
    ] {
        let out_path = dir.path().join(name);
        let out = run(&[cmd, &["-o", out_path.to_str().unwrap(), bad.to_str().unwrap()]].concat());
        assert_eq!(out.status.code(), Some(2), "{name}");
        assert!(text(&out.stderr).contains(UNDECODABLE), "{name}: {}", text(&out.stderr));
        assert!(!out_path.exists(), "a failed {cmd:?} left {name}");
    }
}

#[cfg(feature = "parquet")]
#[test]
fn a_failed_parquet_export_leaves_no_files() {
    let (dir, bad) = undecodable_events();
    let out_dir = dir.path().join("bad.parquet");
    let out = run(&["export", "--parquet", "-o", out_dir.to_str().unwrap(), bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains(UNDECODABLE), "{}", text(&out.stderr));
    assert!(!out_dir.exists(), "a failed export left {:?}", std::fs::read_dir(&out_dir).map(|d| d.count()));
    // Into a directory that was there before: it stays, without the tables.
    std::fs::create_dir_all(&out_dir).unwrap();
    let out = run(&["export", "--parquet", "-o", out_dir.to_str().unwrap(), bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(std::fs::read_dir(&out_dir).unwrap().count(), 0);
    // The same file exports with --salvage, without the damaged chunk.
    let out = run(&["export", "--parquet", "--salvage", "-o", out_dir.to_str().unwrap(), bad.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    for t in ["events", "calls", "code"] {
        assert!(out_dir.join(format!("{t}.parquet")).exists(), "{t}");
    }
}

#[test]
fn help_teaches_with_examples() {
    let out = run(&["info", "--help"]);
    let s = text(&out.stdout);
    assert!(s.contains("Example: ocular-analyze info run.ocl --json"), "{s}");
}
