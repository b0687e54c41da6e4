//! The daemon's word to the node agent that its mount is in place: one byte on the
//! pipe the agent gave it (`--ready-fd`), then the pipe is closed ([`say_mounted`]).
//! The agent waits on the other end ([`wait`], from
//! `node::supervisor::Daemons::await_mounted`) and probes the mount at once instead
//! of polling; the daemon's exit (before mounting) also ends its wait.

use std::io::Write;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::time::Duration;

/// Say "mounted" on the pipe `fd`, if given. Anything but a pipe (or one of the
/// standard descriptors) is left alone: a wrong number must not write into some other
/// file.
pub fn say_mounted(fd: Option<i32>) {
    let Some(fd) = fd.filter(|fd| *fd > 2) else {
        return;
    };
    if !is_pipe(fd) {
        tracing::warn!(fd, "--ready-fd is not a pipe: not used");
        return;
    }
    // SAFETY: the agent gave this process the descriptor for this one use (a pipe,
    // checked above); nothing else in the daemon refers to it, and it is closed here.
    let mut pipe = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    if let Err(e) = pipe.write_all(b"m") {
        tracing::debug!(fd, error = %e, "telling the agent the mount is in place");
    }
}

/// The agent: wait up to `timeout` on the pipe's read end `fd`. `true` once the pipe
/// has said all it will (the daemon's byte, or EOF: it exited before mounting);
/// `false` when not yet (or the wait was interrupted): wait again later.
pub fn wait(fd: BorrowedFd<'_>, timeout: Duration) -> bool {
    let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd, valid for the call; `fd` stays open throughout.
    unsafe { libc::poll(&mut pfd, 1, ms) > 0 }
}

fn is_pipe(fd: i32) -> bool {
    // SAFETY: fstat writes only into `st`, which is valid for the call.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        libc::fstat(fd, &mut st) == 0 && (st.st_mode & libc::S_IFMT) == libc::S_IFIFO
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::os::fd::{AsRawFd, IntoRawFd};

    use super::*;

    #[test]
    fn a_pipe_gets_one_byte_and_is_closed() {
        let (r, w) = nix::unistd::pipe().unwrap();
        say_mounted(Some(w.into_raw_fd()));
        let mut got = Vec::new();
        // read_to_end returns only at EOF: the write end was closed.
        std::fs::File::from(r).read_to_end(&mut got).unwrap();
        assert_eq!(got, b"m");
    }

    /// What the daemon says ends the agent's wait; silence does not, EOF does.
    #[test]
    fn the_agents_wait_ends_with_the_word_or_the_exit() {
        use std::os::fd::AsFd;
        let (r, w) = nix::unistd::pipe().unwrap();
        assert!(
            !wait(r.as_fd(), Duration::from_millis(10)),
            "nothing said yet"
        );
        say_mounted(Some(w.into_raw_fd()));
        assert!(wait(r.as_fd(), Duration::from_secs(5)));
        let (r, w) = nix::unistd::pipe().unwrap();
        drop(w);
        assert!(wait(r.as_fd(), Duration::from_secs(5)), "EOF: exited");
    }

    #[test]
    fn anything_else_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let file = std::fs::File::create(dir.path().join("f")).unwrap();
        say_mounted(Some(file.as_raw_fd()));
        say_mounted(Some(1));
        say_mounted(None);
        // Still open (not taken and closed), and nothing written into it.
        assert!(file.metadata().is_ok());
        assert_eq!(std::fs::read(dir.path().join("f")).unwrap(), b"");
    }
}
