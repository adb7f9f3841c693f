//! `dump` output compared with `testdata/expected/`. Set `OCULAR_BLESS=1` to rewrite the expected files on
//! purpose, then review the diff.

use crate::testdata;

fn check(fixture: &str, expected: &str) {
    let mut out = Vec::new();
    ocular_analyze::dump::dump(&testdata(fixture), Default::default(), &mut out).unwrap();
    let got = String::from_utf8(out).unwrap();
    let path = testdata(expected);
    if std::env::var_os("OCULAR_BLESS").is_some() {
        std::fs::write(&path, &got).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (OCULAR_BLESS=1 creates it)", path.display()));
    if got != want {
        let line = got.lines().zip(want.lines()).position(|(a, b)| a != b).unwrap_or(0);
        panic!(
            "dump of {fixture} differs from {expected} at line {}:\n  got:  {}\n  want: {}",
            line + 1,
            got.lines().nth(line).unwrap_or("<end>"),
            want.lines().nth(line).unwrap_or("<end>")
        );
    }
}

#[test]
fn v1_0_synthetic_dump() {
    check("v1.0/synthetic.ocl", "expected/v1.0-synthetic.dump");
}
