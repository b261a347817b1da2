//! The image's limits while its layers are read: entries and declared
//! bytes counted from the tar headers ([`Budget`]), and the decompressed
//! stream cut off past what they allow ([`Capped`]).

use std::io::Read;
use std::path::Path;

use super::{LayerError, LayerResult};
use crate::error::ImageError;
use crate::limits::{size_text, ImageLimits};

/// What is left of the image's [`ImageLimits`] as its layers are read.
pub(super) struct Budget {
    limits: ImageLimits,
    entries: u64,
    bytes: u64,
}

/// Stream bytes allowed per entry beyond its data: its header, padding and
/// PAX or long-name records.
const ENTRY_OVERHEAD: u64 = 4096;

impl Budget {
    pub(super) fn new(limits: &ImageLimits) -> Self {
        Self {
            limits: *limits,
            entries: 0,
            bytes: 0,
        }
    }

    /// Counts one entry of `size` bytes, refusing it over either limit.
    pub(super) fn take(&mut self, size: u64) -> LayerResult<()> {
        self.entries += 1;
        if self.entries > self.limits.max_entries {
            return Err(LayerError::TooLarge(format!(
                "the image has more than {} entries (files, directories, links), the limit on one image",
                self.limits.max_entries
            )));
        }
        self.bytes = self.bytes.saturating_add(size);
        if self.bytes > self.limits.max_unpacked_bytes {
            return Err(LayerError::TooLarge(format!(
                "the image unpacks to more than {}, the limit on one image's unpacked bytes",
                size_text(self.limits.max_unpacked_bytes)
            )));
        }
        Ok(())
    }

    /// The most decompressed bytes a layer may stream: what the budget
    /// still allows in data, plus each allowed entry's overhead. The tar
    /// reader buffers PAX and long-name records whole, and nothing else
    /// would bound them.
    pub(super) fn stream_cap(&self) -> u64 {
        let entries = self.limits.max_entries.saturating_sub(self.entries) + 1;
        (self.limits.max_unpacked_bytes.saturating_sub(self.bytes))
            .saturating_add(entries.saturating_mul(ENTRY_OVERHEAD))
    }
}

/// A read error of a layer: [`StreamCapped`] (wrapped by `tar` or not) is
/// the image's limit, anything else an I/O error on the cached blob.
pub(super) fn read_error(e: std::io::Error, blob: &Path) -> LayerError {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    while let Some(err) = cur {
        let capped = err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .is_some_and(|inner| inner.is::<StreamCapped>());
        if capped || err.is::<StreamCapped>() {
            return LayerError::TooLarge(StreamCapped.to_string());
        }
        cur = err.source();
    }
    LayerError::Image(ImageError::Io {
        what: "reading a layer",
        path: blob.to_path_buf(),
        source: e,
    })
}

/// A reader that fails with [`StreamCapped`] once more than `left` bytes
/// have come through.
pub(super) struct Capped<R> {
    pub(super) inner: R,
    pub(super) left: u64,
}

impl<R: Read> Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.left = self
            .left
            .checked_sub(n as u64)
            .ok_or_else(|| std::io::Error::other(StreamCapped))?;
        Ok(n)
    }
}

#[derive(Debug, thiserror::Error)]
#[error(
    "the layer's tar stream is longer than the image's limits on unpacked bytes and entries allow"
)]
struct StreamCapped;
