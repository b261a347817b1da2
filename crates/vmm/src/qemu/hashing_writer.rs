//! A buffered writer that hashes what it writes on a second thread, so
//! that a save's SHA-256 costs no second pass over the file and overlaps
//! with the write (and the fsync after it) instead of following it.
//!
//! The buffer itself goes to the hashing thread once it is written to the
//! file, and comes back to be filled again, so the bytes are not copied
//! for the hash. It lends its free space ([`ReserveWrite`]) so that pages
//! can be read from the VMM straight into it.

use std::io::{self, Write};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::thread::JoinHandle;

use sha2::{Digest, Sha256};

use super::ram_frame::ReserveWrite;

/// Size of one buffer (2 MiB): two batches of pages, so a batch seldom
/// waits for a buffer to be handed over.
const BUFFER: usize = 2 << 20;
/// Buffers in use at most: one being filled, the others with the hashing
/// thread. This bounds the memory a save holds (6 MiB).
const BUFFERS: usize = 3;

pub struct HashingWriter<W: Write> {
    inner: W,
    buf: Vec<u8>,
    filled: usize,
    allocated: usize,
    to_hasher: Option<SyncSender<(Vec<u8>, usize)>>,
    returned: Receiver<Vec<u8>>,
    hasher: Option<JoinHandle<String>>,
}

fn hasher_gone() -> io::Error {
    io::Error::other("the hashing thread is gone")
}

impl<W: Write> HashingWriter<W> {
    pub fn new(inner: W) -> Self {
        let (to_hasher, work) = sync_channel::<(Vec<u8>, usize)>(BUFFERS);
        let (give_back, returned) = sync_channel::<Vec<u8>>(BUFFERS);
        let hasher = std::thread::spawn(move || {
            let mut h = Sha256::new();
            for (buf, len) in work {
                h.update(&buf[..len]);
                // The writer may have finished and stopped taking buffers.
                let _ = give_back.try_send(buf);
            }
            hex::encode(h.finalize())
        });
        HashingWriter {
            inner,
            buf: vec![0; BUFFER],
            filled: 0,
            allocated: 1,
            to_hasher: Some(to_hasher),
            returned,
            hasher: Some(hasher),
        }
    }

    /// The hex SHA-256 of everything written, and the inner writer. Writes
    /// what is still buffered first; call [`Write::flush`] before syncing
    /// the file and this after, so the hash finishes during the sync.
    pub fn finish(mut self) -> io::Result<(String, W)> {
        self.hand_over()?;
        drop(self.to_hasher.take());
        let digest = self
            .hasher
            .take()
            .and_then(|h| h.join().ok())
            .ok_or_else(|| io::Error::other("the hashing thread panicked"))?;
        Ok((digest, self.inner))
    }

    /// Writes the buffered bytes to the inner writer and hands the buffer
    /// to the hashing thread, taking an empty one back.
    fn hand_over(&mut self) -> io::Result<()> {
        if self.filled == 0 {
            return Ok(());
        }
        self.inner.write_all(&self.buf[..self.filled])?;
        let next = self.empty_buffer()?;
        let full = std::mem::replace(&mut self.buf, next);
        self.to_hasher
            .as_ref()
            .ok_or_else(hasher_gone)?
            .send((full, self.filled))
            .map_err(|_| hasher_gone())?;
        self.filled = 0;
        Ok(())
    }

    fn empty_buffer(&mut self) -> io::Result<Vec<u8>> {
        if let Ok(buf) = self.returned.try_recv() {
            return Ok(buf);
        }
        if self.allocated < BUFFERS {
            self.allocated += 1;
            return Ok(vec![0; BUFFER]);
        }
        self.returned.recv().map_err(|_| hasher_gone())
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.filled == BUFFER {
            self.hand_over()?;
        }
        let n = data.len().min(BUFFER - self.filled);
        self.buf[self.filled..self.filled + n].copy_from_slice(&data[..n]);
        self.filled += n;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.hand_over()?;
        self.inner.flush()
    }
}

impl<W: Write> ReserveWrite for HashingWriter<W> {
    fn with_reserved(
        &mut self,
        n: usize,
        fill: impl FnOnce(&mut [u8]) -> io::Result<usize>,
    ) -> io::Result<()> {
        if n > BUFFER {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{n} bytes asked for in place; a buffer holds {BUFFER}"),
            ));
        }
        if BUFFER - self.filled < n {
            self.hand_over()?;
        }
        let used = fill(&mut self.buf[self.filled..self.filled + n])?;
        self.filled += used.min(n);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Plain writes and writes in place, across many buffer hand-overs,
    /// reach the inner writer in order and hash to its SHA-256.
    #[test]
    fn digest_is_the_sha256_of_what_was_written() {
        let mut w = HashingWriter::new(Vec::new());
        for i in 0..3000u32 {
            w.write_all(&i.to_le_bytes().repeat(1000)).unwrap();
            w.with_reserved(5000, |room| {
                room[..3].copy_from_slice(&[1, 2, 3]);
                Ok(3)
            })
            .unwrap();
        }
        w.flush().unwrap();
        let (digest, out) = w.finish().unwrap();
        assert_eq!(out.len(), 3000 * 4003);
        assert_eq!(&out[4000..4003], &[1, 2, 3]);
        assert_eq!(digest, hex::encode(Sha256::digest(&out)));
    }

    #[test]
    fn refuses_more_in_place_than_a_buffer() {
        let mut w = HashingWriter::new(Vec::new());
        let e = w.with_reserved(BUFFER + 1, |_| Ok(0)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        let (digest, out) = w.finish().unwrap();
        assert!(out.is_empty());
        assert_eq!(digest, hex::encode(Sha256::digest(b"")));
    }
}
