//! Output files of the exports: never the input, and never half-written under their final name.
//!
//! An output is written to a temporary file beside it (same directory, so same file system) and renamed
//! into place once whole: a failed or interrupted export leaves the file that was there before, and a
//! reader never sees a partial one. An output that is the input, by device and inode (so `./t.ocl` and a
//! symlink to it count), is refused before anything is created: `File::create` on it used to truncate the
//! trace that was about to be read.

use anyhow::Context;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// Fails if `output` is the same file as `input` (following symlinks). A missing output is not the input.
pub fn refuse_input(input: &Path, output: &Path) -> anyhow::Result<()> {
    if same_file(input, output) {
        anyhow::bail!(
            "{} is the input trace {}: writing it would destroy the trace; choose another output with -o",
            output.display(),
            input.display()
        );
    }
    Ok(())
}

#[cfg(unix)]
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

#[cfg(not(unix))]
fn same_file(a: &Path, b: &Path) -> bool {
    matches!((std::fs::canonicalize(a), std::fs::canonicalize(b)), (Ok(a), Ok(b)) if a == b)
}

/// An output being written: a temporary file beside `path`, renamed to `path` by [`Pending::commit`] and
/// removed if dropped before that.
#[derive(Debug)]
pub struct Pending {
    tmp: PathBuf,
    path: PathBuf,
    committed: bool,
}

impl Pending {
    /// Refuses `path` if it is `input`, then creates the temporary file beside it. A `path` that is a
    /// symlink is written through: its target is replaced, the link stays.
    pub fn create(input: &Path, path: &Path) -> anyhow::Result<(Pending, File)> {
        refuse_input(input, path)?;
        let path = match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_symlink() => {
                std::fs::canonicalize(path).with_context(|| format!("cannot follow the symlink {}", path.display()))?
            }
            _ => path.to_owned(),
        };
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let tmp =
            path.with_file_name(format!(".{name}.{}-{}.tmp", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed)));
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .with_context(|| format!("cannot create {}", path.display()))?;
        Ok((Pending { tmp, path, committed: false }, file))
    }

    /// The final name.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Renames the finished file into place. Its writer must be flushed and closed first.
    pub fn commit(mut self) -> anyhow::Result<()> {
        std::fs::rename(&self.tmp, &self.path).with_context(|| format!("cannot write {}", self.path.display()))?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_output_leaves_the_old_file_and_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("in.ocl");
        let out = dir.path().join("out.json");
        std::fs::write(&input, b"trace").unwrap();
        std::fs::write(&out, b"old").unwrap();
        let (p, f) = Pending::create(&input, &out).unwrap();
        std::io::Write::write_all(&mut &f, b"half").unwrap();
        drop((p, f));
        assert_eq!(std::fs::read(&out).unwrap(), b"old");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
        let (p, f) = Pending::create(&input, &out).unwrap();
        std::io::Write::write_all(&mut &f, b"new").unwrap();
        drop(f);
        p.commit().unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), b"new");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
    }
}
