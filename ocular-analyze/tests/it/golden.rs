//! `dump` output compared with `testdata/expected/`. Set `OCULAR_BLESS=1` to rewrite the expected files on
//! purpose, then review the diff.

use crate::testdata;

fn check(fixture: &str, expected: &str) {
    let mut out = Vec::new();
    ocular_analyze::dump::dump(&testdata(fixture), Default::default(), &mut out).unwrap();
    compare(fixture, expected, without_dir(String::from_utf8(out).unwrap()));
}

/// The dump's warnings name the file: with the checkout's directory replaced, they compare anywhere.
fn without_dir(dump: String) -> String {
    dump.replace(&testdata("").display().to_string(), "<testdata>/")
}

fn compare(fixture: &str, expected: &str, got: String) {
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

#[test]
fn v2_0_synthetic_dump() {
    check("v2.0/synthetic.ocl", "expected/v2.0-synthetic.dump");
}

#[test]
fn v2_1_synthetic_dump() {
    check("v2.1/synthetic.ocl", "expected/v2.1-synthetic.dump");
}

/// The synthetic fixtures hold the same recording in three layouts: apart from the version and the
/// chunk lines (sizes and offsets), their dumps are the same, record for record.
#[test]
fn both_format_versions_dump_the_same_records() {
    let records = |fixture: &str| -> Vec<String> {
        let mut out = Vec::new();
        ocular_analyze::dump::dump(&testdata(fixture), Default::default(), &mut out).unwrap();
        String::from_utf8(out)
            .unwrap()
            .lines()
            .filter(|l| !l.starts_with("format ") && !l.starts_with("chunk "))
            .map(|l| l.replace(fixture, "synthetic.ocl"))
            .collect()
    };
    let (v1, v2) = (records("v1.0/synthetic.ocl"), records("v2.0/synthetic.ocl"));
    assert!(v1.len() > 100, "{} lines", v1.len());
    assert_eq!(v1, v2);
    assert_eq!(v1, records("v2.1/synthetic.ocl"));
}

#[test]
fn loops_reports() {
    for (fixture, name) in
        [("v1.0/loops-adaptive.ocl", "v1.0-loops-adaptive"), ("v1.0/loops-precise.ocl", "v1.0-loops-precise")]
    {
        let a = ocular_analyze::analysis::analyze(&testdata(fixture), Default::default()).unwrap();
        compare(fixture, &format!("expected/{name}.hot"), ocular_analyze::hot::report(&a, 10).to_string());
        let span = a.span;
        let stats = ocular_analyze::stats::report(&a, span, false, ocular_analyze::stats::SortBy::Exclusive, 50);
        compare(fixture, &format!("expected/{name}.stats"), stats.to_string());
    }
}
