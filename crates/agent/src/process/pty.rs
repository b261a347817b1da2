//! Pseudo-terminals: the master side, read and written asynchronously, and
//! resized with `TIOCSWINSZ`.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use nix::pty::{openpty, Winsize};
use tokio::io::unix::AsyncFd;

/// A new pty pair: the master stays in the agent, the slave becomes the
/// child's stdin, stdout and stderr (and controlling terminal).
pub struct PtyPair {
    pub master: PtyMaster,
    pub slave: OwnedFd,
}

/// Opens a pty of `cols` x `rows`.
pub fn open(cols: u16, rows: u16) -> io::Result<PtyPair> {
    let size = winsize(cols, rows);
    let pair = openpty(Some(&size), None).map_err(io::Error::from)?;
    // openpty(3) does not set close-on-exec: without it every later child
    // would inherit both ends, and the master would never see EOF/EIO.
    set_cloexec(&pair.master)?;
    set_cloexec(&pair.slave)?;
    set_nonblocking(&pair.master)?;
    // SAFETY: the OwnedFd is open and the AsyncFd owns it from here on, so
    // it stays the same descriptor until the AsyncFd is dropped.
    let fd = unsafe { AsyncFd::register(pair.master) }?;
    Ok(PtyPair {
        master: PtyMaster { fd },
        slave: pair.slave,
    })
}

/// The agent's end of a pty.
pub struct PtyMaster {
    fd: AsyncFd<OwnedFd>,
}

impl PtyMaster {
    /// Reads output; `Ok(0)` once no process holds the slave open any more
    /// (Linux reports that as `EIO`).
    pub async fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let mut guard = self.fd.readable().await?;
            let res = guard.try_io(|fd| {
                // SAFETY: buf is valid for buf.len() bytes; the fd is owned.
                let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            });
            match res {
                Ok(Ok(n)) => return Ok(n),
                Ok(Err(e)) if e.raw_os_error() == Some(libc::EIO) => return Ok(0),
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
    }

    /// Writes all of `data` as terminal input.
    pub async fn write_all(&self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            let mut guard = self.fd.writable().await?;
            let res = guard.try_io(|fd| {
                // SAFETY: data is valid for data.len() bytes; the fd is owned.
                let n = unsafe { libc::write(fd.as_raw_fd(), data.as_ptr().cast(), data.len()) };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            });
            match res {
                Ok(Ok(n)) => data = &data[n..],
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => {}
            }
        }
        Ok(())
    }

    /// Sets the terminal size; the kernel sends SIGWINCH to the foreground
    /// process group.
    pub fn resize(&self, cols: u16, rows: u16) -> io::Result<()> {
        let size = winsize(cols, rows);
        // SAFETY: TIOCSWINSZ reads one Winsize from the pointer.
        let rc = unsafe { libc::ioctl(self.fd.get_ref().as_raw_fd(), libc::TIOCSWINSZ, &size) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

fn winsize(cols: u16, rows: u16) -> Winsize {
    Winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}

fn set_cloexec(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: fcntl on an owned, open fd.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn set_nonblocking(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: fcntl on an owned, open fd.
    unsafe {
        let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}
