//! The kernel state `/init` fixes after a snapshot resume: the wall clock
//! and the random number generator.
//!
//! A guest resumed from a memory snapshot wakes with the clock of the moment
//! the snapshot was taken, and every clone of one snapshot wakes with the
//! same CRNG state, so all of them would hand out the same "random" bytes
//! until the kernel reseeds on its own (up to a minute later).

use std::fs::OpenOptions;
use std::io;
use std::os::fd::AsRawFd;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nix::sys::time::TimeSpec;
use nix::time::{clock_settime, ClockId};

/// Below this skew the clock is left alone: the host's timestamp is already
/// older than the request latency, so "correcting" a sub-threshold skew would
/// only step the clock backwards.
pub const CLOCK_SKEW_TOLERANCE: Duration = Duration::from_millis(50);

/// `_IOW('R', 0x03, int[2])`: add bytes to the input pool and credit entropy.
const RNDADDENTROPY: libc::c_ulong = 0x4008_5203;
/// `_IO('R', 0x07)`: reseed the CRNG from the input pool now (Linux >= 4.17).
const RNDRESEEDCRNG: libc::c_ulong = 0x5207;

/// What happened to the clock.
#[derive(Debug, PartialEq, Eq)]
pub enum ClockOutcome {
    /// Within [`CLOCK_SKEW_TOLERANCE`]; untouched.
    InSync,
    /// Stepped by this much (positive: forward).
    Set { skew_ms: i64 },
}

/// Sets CLOCK_REALTIME to `seconds.nanos` past the epoch when it is off by
/// more than the tolerance. Needs CAP_SYS_TIME.
pub fn set_clock(seconds: i64, nanos: i32) -> io::Result<ClockOutcome> {
    let target_ns = i128::from(seconds) * 1_000_000_000 + i128::from(nanos);
    let now_ns = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i128)
        .unwrap_or(0);
    let skew_ns = target_ns - now_ns;
    if skew_ns.unsigned_abs() < CLOCK_SKEW_TOLERANCE.as_nanos() {
        return Ok(ClockOutcome::InSync);
    }
    let ts = TimeSpec::new(seconds, i64::from(nanos));
    clock_settime(ClockId::CLOCK_REALTIME, ts).map_err(io::Error::from)?;
    Ok(ClockOutcome::Set {
        skew_ms: (skew_ns / 1_000_000) as i64,
    })
}

/// Mixes `bytes` (fresh randomness from the host) into the kernel's pool,
/// crediting them as entropy, then forces the CRNG to reseed so
/// `/dev/urandom` and `getrandom` diverge from every other clone at once.
/// Needs CAP_SYS_ADMIN.
pub fn add_entropy(bytes: &[u8]) -> io::Result<()> {
    if bytes.is_empty() {
        return Ok(());
    }
    let random = OpenOptions::new().write(true).open("/dev/random")?;
    // struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
    let len =
        i32::try_from(bytes.len()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let mut info = Vec::with_capacity(8 + bytes.len());
    info.extend_from_slice(&len.saturating_mul(8).to_ne_bytes());
    info.extend_from_slice(&len.to_ne_bytes());
    info.extend_from_slice(bytes);
    // The kernel reads buf as __u32 words: pad to a multiple of 4 bytes.
    info.resize(info.len().div_ceil(4) * 4, 0);
    // SAFETY: info holds a complete rand_pool_info for buf_size bytes and
    // outlives the call; the fd is open.
    let rc = unsafe { libc::ioctl(random.as_raw_fd(), RNDADDENTROPY as _, info.as_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: RNDRESEEDCRNG takes no argument.
    let rc = unsafe { libc::ioctl(random.as_raw_fd(), RNDRESEEDCRNG as _) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_in_sync_is_left_alone() {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        let out = set_clock(now.as_secs() as i64, now.subsec_nanos() as i32).unwrap();
        assert_eq!(out, ClockOutcome::InSync);
    }

    #[test]
    fn empty_entropy_is_a_no_op() {
        add_entropy(&[]).unwrap();
    }
}
