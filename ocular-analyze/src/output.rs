//! Output files of the exports: never the input, and never half-written under their final name.
//!
//! An output is written to a temporary file beside it (same directory, so same file system) and renamed
//! into place once whole: a failed or interrupted export leaves the file that was there before, and a
//! reader never sees a partial one. An output that is the input, by device and inode (so `./t.ocl` and a
//! symlink to it count), is refused before anything is created: `File::create` on it used to truncate the
//! trace that was about to be read.

use anyhow::Context;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::thread::JoinHandle;

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

/// Writes the output `path` of input `input` with `write`: refused if it is the input, written beside it
/// through a [`Background`] writer, and renamed into place once whole (an error leaves the file that was
/// there before).
pub fn write<T>(
    input: &Path,
    path: &Path,
    write: impl FnOnce(&mut Background) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    let (pending, f) = Pending::create(input, path)?;
    let mut w = Background::new(f).with_context(|| format!("cannot write {}", path.display()))?;
    let v = write(&mut w)?;
    w.finish().with_context(|| format!("cannot write {}", path.display()))?;
    pending.commit()?;
    Ok(v)
}

/// Bytes handed to the writing thread at a time.
const BLOCK: usize = 1 << 20;

/// A buffered writer whose writes to its file happen on a thread of its own: an export's encoding and the
/// kernel's copy of what it wrote into the page cache (a quarter of the time of a large Perfetto export,
/// done on the exporting thread before) overlap on a machine with a second core. Everything is in the
/// file once [`Background::finish`] returns; an error writing it comes out of the next write or of
/// `finish`.
#[derive(Debug)]
pub struct Background {
    buf: Vec<u8>,
    tx: Option<SyncSender<Vec<u8>>>,
    /// Blocks written, sent back to be filled again.
    spare: Receiver<Vec<u8>>,
    thread: Option<JoinHandle<std::io::Result<File>>>,
}

impl Background {
    /// Starts the writing thread for `file`.
    pub fn new(mut file: File) -> std::io::Result<Self> {
        let (tx, rx) = sync_channel::<Vec<u8>>(2);
        let (give_back, spare) = sync_channel::<Vec<u8>>(3);
        let thread = std::thread::Builder::new().name("ocular-write".into()).spawn(move || {
            for mut block in rx {
                file.write_all(&block)?;
                block.clear();
                let _ = give_back.try_send(block);
            }
            Ok(file)
        })?;
        Ok(Background { buf: Vec::with_capacity(BLOCK), tx: Some(tx), spare, thread: Some(thread) })
    }

    /// Hands the buffer to the writing thread; its error if it stopped.
    fn send(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let next = self.spare.try_recv().unwrap_or_else(|_| Vec::with_capacity(BLOCK));
        let block = std::mem::replace(&mut self.buf, next);
        let sent = self.tx.as_ref().is_some_and(|tx| tx.send(block).is_ok());
        if sent {
            Ok(())
        } else {
            // The thread stopped on an error: it says which.
            self.join().map(drop)
        }
    }

    fn join(&mut self) -> std::io::Result<File> {
        self.tx = None;
        match self.thread.take() {
            Some(t) => t.join().unwrap_or_else(|p| std::panic::resume_unwind(p)),
            None => Err(std::io::Error::other("the output's writer already stopped")),
        }
    }

    /// Writes what is left and waits for the writing thread: the file, whole, or the first error.
    pub fn finish(mut self) -> std::io::Result<File> {
        self.send()?;
        self.join()
    }
}

impl Write for Background {
    #[inline]
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if self.buf.len() + b.len() > BLOCK {
            self.send()?;
        }
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }

    #[inline]
    fn write_all(&mut self, b: &[u8]) -> std::io::Result<()> {
        self.write(b).map(drop)
    }

    /// Hands what is buffered to the writing thread (it is in the file once [`Background::finish`] returns).
    fn flush(&mut self) -> std::io::Result<()> {
        self.send()
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

    #[test]
    fn the_background_writer_writes_every_byte_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.bin");
        let mut w = Background::new(File::create(&path).unwrap()).unwrap();
        let mut expected = Vec::new();
        // Writes small and larger than a block, so blocks are handed over mid-write and reused.
        for i in 0..5000u32 {
            let n = if i % 1000 == 999 { BLOCK + 17 } else { (i % 97) as usize };
            let chunk: Vec<u8> = (0..n).map(|k| (k as u32 ^ i) as u8).collect();
            w.write_all(&chunk).unwrap();
            expected.extend_from_slice(&chunk);
        }
        drop(w.finish().unwrap());
        assert_eq!(std::fs::read(&path).unwrap(), expected);
    }

    #[test]
    fn a_failed_write_is_an_error_not_a_short_file() {
        // /dev/full fails every write with ENOSPC.
        let Ok(f) = std::fs::OpenOptions::new().write(true).open("/dev/full") else { return };
        let mut w = Background::new(f).unwrap();
        let mut failed = None;
        for _ in 0..8 {
            if let Err(e) = w.write_all(&vec![1u8; BLOCK]) {
                failed = Some(e);
                break;
            }
        }
        let e = failed.or_else(|| w.finish().err()).expect("an error");
        assert_eq!(e.raw_os_error(), Some(28), "ENOSPC expected: {e}");
    }
}
