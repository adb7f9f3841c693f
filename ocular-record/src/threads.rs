//! Ocular's own threads (the writer, the windows' opener, the counters' drain) take no signal meant for
//! the program.
//!
//! A signal sent to the process (`kill PID`, Ctrl-C) goes to any thread that does not block it. When it
//! went to one of Ocular's, the program's main thread, blocked in a lock or a system call, was not
//! interrupted, so Python never ran its handler there: a `multiprocessing.Pool` worker waiting on its
//! queue's lock outlived the `SIGTERM` of `Pool.terminate()`, and the program hung in `join()`
//! (1 run in ~40 of a pool program). A thread made by [`spawn`] blocks every signal from its first
//! instruction, so they go to the program's threads, as without Ocular.

use std::io;
use std::thread::{Builder, JoinHandle};

/// `std::thread::Builder::spawn` of a thread named `name` that blocks every signal (it inherits the mask
/// set around its creation, so no signal can reach it before it runs), and notes its end for a fork
/// ([`ocular_format::exited`]).
pub fn spawn<F, T>(name: &str, f: F) -> io::Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let f = move || {
        let out = f();
        ocular_format::exited::note_exit();
        out
    };
    #[cfg(unix)]
    {
        // SAFETY: sigset_t is plain data, filled by sigfillset; pthread_sigmask only changes this thread's
        // mask, and the old one is put back below whatever spawn returned.
        unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
            let r = Builder::new().name(name.into()).spawn(f);
            libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
            r
        }
    }
    #[cfg(not(unix))]
    {
        Builder::new().name(name.into()).spawn(f)
    }
}
