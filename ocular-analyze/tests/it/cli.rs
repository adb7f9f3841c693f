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
    let dir = std::env::temp_dir().join(format!("ocular-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cut = dir.join("cut.ocl");
    std::fs::write(&cut, &bytes[..1300]).unwrap();
    let out = run(&["info", "--json", cut.to_str().unwrap()]);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["events"], 0);
    assert_eq!(v["closed_cleanly"], false);
    let err = text(&out.stderr);
    assert!(err.contains("cut.ocl: incomplete chunk at offset 1237 (63 bytes) ignored"), "{err}");
    assert!(err.contains("no trailer: the recording did not close cleanly"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_corrupt_file_names_the_offset_and_salvage_skips_it() {
    let mut bytes = std::fs::read(testdata("v1.0/synthetic.ocl")).unwrap();
    bytes[1237 + 70] ^= 0xff; // inside the first EVENTS chunk's payload
    let dir = std::env::temp_dir().join(format!("ocular-cli-corrupt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.ocl");
    std::fs::write(&bad, &bytes).unwrap();
    let out = run(&["info", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("bad.ocl: corrupt chunk at offset 1237: CRC mismatch"), "{}", text(&out.stderr));
    let out = run(&["info", "--json", "--salvage", bad.to_str().unwrap()]);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["events"], 83 - 43);
    assert!(text(&out.stderr).contains("skipped"), "{}", text(&out.stderr));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn help_teaches_with_examples() {
    let out = run(&["info", "--help"]);
    let s = text(&out.stdout);
    assert!(s.contains("Example: ocular-analyze info run.ocl --json"), "{s}");
}
