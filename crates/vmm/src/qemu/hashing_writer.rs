//! A writer that hashes what it writes on a second thread, so that a save's
//! SHA-256 costs no second pass over the file and overlaps with the write
//! (and the fsync after it) instead of following it.

use std::io::{self, Write};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::thread::JoinHandle;

use sha2::{Digest, Sha256};

/// Chunks in flight to the hashing thread; each is one write of the
/// `BufWriter` above (1 MiB), so this bounds the memory it holds.
const QUEUE: usize = 8;

pub struct HashingWriter<W: Write> {
    inner: W,
    tx: Option<SyncSender<Vec<u8>>>,
    hasher: Option<JoinHandle<String>>,
}

impl<W: Write> HashingWriter<W> {
    pub fn new(inner: W) -> Self {
        let (tx, rx) = sync_channel::<Vec<u8>>(QUEUE);
        let hasher = std::thread::spawn(move || {
            let mut h = Sha256::new();
            for chunk in rx {
                h.update(&chunk);
            }
            hex::encode(h.finalize())
        });
        HashingWriter {
            inner,
            tx: Some(tx),
            hasher: Some(hasher),
        }
    }

    /// The hex SHA-256 of everything written, and the inner writer.
    pub fn finish(mut self) -> io::Result<(String, W)> {
        drop(self.tx.take());
        let digest = self
            .hasher
            .take()
            .and_then(|h| h.join().ok())
            .ok_or_else(|| io::Error::other("the hashing thread panicked"))?;
        // `self` has nothing left to drop but `inner`.
        let HashingWriter { inner, .. } = self;
        Ok((digest, inner))
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        if let Some(tx) = &self.tx {
            tx.send(buf[..n].to_vec())
                .map_err(|_| io::Error::other("the hashing thread is gone"))?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_is_the_sha256_of_what_was_written() {
        let mut w = HashingWriter::new(Vec::new());
        for i in 0..300u32 {
            w.write_all(&i.to_le_bytes().repeat(1000)).unwrap();
        }
        let (digest, out) = w.finish().unwrap();
        assert_eq!(digest, hex::encode(Sha256::digest(&out)));
        assert_eq!(out.len(), 300 * 4000);
    }
}
