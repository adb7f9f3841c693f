//! Closing a trace whose writer failed (`complete::seal`) when the disk has no room for the closing
//! records where the failure cut it: the trace gives up its last events chunk, counted as lost, rather
//! than stay unclosed.

use super::util::{code, loop_events};
use ocular_format::testing::header;
use ocular_format::*;
use std::os::unix::process::CommandExt;
use std::process::Command;

const CHILD: &str = "OCULAR_TEST_SEAL_CHILD";

/// Run by [`a_trace_cut_just_below_a_size_limit_gives_up_a_chunk_to_close`] in a child process whose file
/// size limit the parent set (the limit applies to a whole process): seals the trace its environment names.
#[test]
fn seal_in_a_size_limited_child() {
    let Some(path) = std::env::var_os(CHILD) else { return };
    let lost = Lost { thread_id: 100, count: 500, first_ticks: 90_000, last_ticks: 95_000 };
    let sealed = complete::seal(std::path::Path::new(&path), &[lost], 99_000, 1_123_456_789);
    println!("sealed: {sealed:?}");
}

#[test]
fn a_trace_cut_just_below_a_size_limit_gives_up_a_chunk_to_close() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.ocl");
    let mut w =
        Writer::new(Vec::new(), "t.ocl", &header(), WriterOptions { compress: false, ..Default::default() }).unwrap();
    w.code_objects(&[code(1, "work")]).unwrap();
    w.thread(&ThreadInfo { thread_id: 100, name: "MainThread".into(), is_main: true }).unwrap();
    let mut sent = 0;
    for i in 0..5u64 {
        let ev = loop_events(1, 10_000 * (i + 1), 200);
        sent += ev.len();
        w.events(100, &ev).unwrap();
    }
    // The writer failed on its next chunk: the file ends with part of it.
    let mut bytes = w.finish_open();
    let whole = bytes.len() as u64;
    bytes.extend_from_slice(b"OCCH\x01\x00\x00\x00\x10\x00\x00\x00");
    std::fs::write(&path, &bytes).unwrap();
    // Room for 8 more bytes past the last whole chunk: not for a LOST record and a trailer.
    let limit = whole + 8;
    // SAFETY: the closure runs in the child between fork and exec and calls only async-signal-safe
    // functions (signal, setrlimit) on values it owns.
    let out = unsafe {
        Command::new(std::env::current_exe().unwrap())
            .args(["seal::seal_in_a_size_limited_child", "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD, &path)
            .pre_exec(move || {
                // Both survive the exec: a write past the limit then fails with EFBIG instead of a signal.
                libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
                let l = libc::rlimit { rlim_cur: limit, rlim_max: limit };
                if libc::setrlimit(libc::RLIMIT_FSIZE, &l) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            })
            .output()
            .unwrap()
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("sealed: Ok(Some("),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bytes = std::fs::read(&path).unwrap();
    assert!(bytes.len() as u64 <= limit);
    let all = super::util::read_all(&bytes, false).unwrap();
    let r = &all.report;
    assert!(all.trailer.is_some() && r.mismatch.is_none() && r.damage.is_empty() && r.truncated.is_none(), "{r:?}");
    // Four chunks stay; the fifth joins the 500 events lost after the failure, in one record for the thread.
    let per_chunk = sent / 5;
    assert_eq!(all.event_count(), 4 * per_chunk);
    assert_eq!(all.lost.len(), 1, "{:?}", all.lost);
    let l = &all.lost[0];
    assert_eq!((l.thread_id, l.count), (100, 500 + per_chunk as u64), "{l:?}");
    assert_eq!(l.last_ticks, 95_000);
    assert!(l.first_ticks == 50_000, "{l:?}");
    assert_eq!(all.event_count() as u64 + l.count, sent as u64 + 500);
}
