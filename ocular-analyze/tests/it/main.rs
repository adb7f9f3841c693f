//! Integration tests of the analyzer: golden dumps of frozen files, the CLI's output and its errors.

mod cli;
mod export;
mod golden;
mod reports;

/// `testdata/` at the top of the workspace.
pub fn testdata(rel: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata").join(rel)
}
