//! The startup manifest: which guest-memory pages a resumed VM touches from
//! resume until its agent answers, and in which order it first touched them.
//!
//! Binary format, version 1, all integers little-endian:
//!
//! ```text
//! offset size  field
//!      0    8  magic "SIESTAMF"
//!      8    2  version (1)
//!     10    2  flags (0; reserved)
//!     12    4  page size in bytes (power of two, 4 KiB .. 2 MiB)
//!     16    8  guest memory size in bytes (multiple of the page size)
//!     24    4  R: number of merged ranges
//!     28    4  O: number of first-touch runs
//!     32  16R  ranges: (offset u64, length u64), sorted, disjoint, not adjacent
//!   .. 16O  runs:   (offset u64, length u64) in first-touch order
//! ```
//!
//! Offsets and lengths are in bytes of guest memory (= bytes of the memory
//! file, which maps guest memory from offset 0), page-aligned, non-empty and
//! inside the guest memory. The runs cover exactly the pages of the ranges,
//! each once: the ranges say *what* to read, the runs *in which order*. The
//! file length must be exactly `32 + 16 (R + O)` and at most
//! [`MAX_MANIFEST_BYTES`]. Integrity is not inside the file: the snapshot
//! record carries a [`ManifestDescriptor`] with the file's size and SHA-256,
//! checked before the body is parsed.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

#[cfg(test)]
mod tests;

pub const MAGIC: &[u8; 8] = b"SIESTAMF";
pub const VERSION: u16 = 1;
const HEADER_LEN: usize = 32;
const ENTRY_LEN: usize = 16;
/// Upper bound on a manifest file: 16 MiB is ~1M entries, far more than a
/// start-up touches; anything bigger is refused before it is read whole.
pub const MAX_MANIFEST_BYTES: u64 = 16 << 20;

/// Everything that can be wrong with a manifest. Each is a reason to fall
/// back to on-demand paging, never to fail a resume.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ManifestError {
    #[error("manifest is {size} bytes, more than the {max}-byte bound")]
    TooLarge { size: u64, max: u64 },
    #[error("manifest is {actual} bytes but its descriptor says {expected}")]
    SizeMismatch { expected: u64, actual: u64 },
    #[error("manifest SHA-256 is {actual} but its descriptor says {expected}")]
    HashMismatch { expected: String, actual: String },
    #[error("manifest descriptor is version {descriptor} but the file is version {file}")]
    DescriptorVersion { descriptor: u16, file: u16 },
    #[error("manifest is {len} bytes, shorter than its {HEADER_LEN}-byte header")]
    Truncated { len: usize },
    #[error("not a manifest (bad magic)")]
    BadMagic,
    #[error("manifest version {0} is not supported (this build reads {VERSION})")]
    UnsupportedVersion(u16),
    #[error("manifest flags {0:#x} are not supported")]
    UnsupportedFlags(u16),
    #[error("manifest page size {0} is not a power of two between 4 KiB and 2 MiB")]
    BadPageSize(u32),
    #[error("manifest guest memory size {size} is not a non-zero multiple of page size {page}")]
    BadMemorySize { size: u64, page: u32 },
    #[error("manifest is for {manifest} bytes of guest memory but the snapshot has {snapshot}")]
    MemorySizeMismatch { manifest: u64, snapshot: u64 },
    #[error(
        "manifest counts {ranges} ranges and {runs} runs, so {expected} bytes, but it is {actual}"
    )]
    LengthMismatch {
        ranges: u32,
        runs: u32,
        expected: u64,
        actual: u64,
    },
    #[error("manifest {what} {index} ({offset:#x}+{len:#x}) is empty or not page-aligned")]
    Unaligned {
        what: &'static str,
        index: usize,
        offset: u64,
        len: u64,
    },
    #[error("manifest {what} {index} ({offset:#x}+{len:#x}) ends beyond guest memory")]
    OutOfBounds {
        what: &'static str,
        index: usize,
        offset: u64,
        len: u64,
    },
    #[error("manifest range {0} is not after (and apart from) the one before it")]
    RangesNotMerged(usize),
    #[error("manifest runs do not cover the ranges' pages exactly once")]
    RunsMismatch,
}

/// A byte range of guest memory (and of the memory file).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Range {
    pub offset: u64,
    pub len: u64,
}

impl Range {
    pub fn end(&self) -> u64 {
        self.offset + self.len
    }
}

/// A decoded, validated manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    pub page_size: u32,
    pub guest_memory_size: u64,
    /// Sorted, disjoint, non-adjacent.
    pub ranges: Vec<Range>,
    /// The same pages, in first-touch order.
    pub runs: Vec<Range>,
}

/// What a snapshot record says about its manifest; checked before the
/// manifest is used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestDescriptor {
    pub version: u16,
    /// Bytes of the manifest file.
    pub size: u64,
    /// Guest memory the manifest was recorded for.
    pub guest_memory_size: u64,
    /// Hex SHA-256 of the manifest file.
    pub sha256: String,
}

impl Manifest {
    /// Builds a manifest from page indices in first-touch order (each page
    /// once; later duplicates are ignored).
    pub fn from_touch_order(page_size: u32, guest_memory_size: u64, pages: &[u64]) -> Self {
        let ps = u64::from(page_size);
        let mut seen = std::collections::HashSet::with_capacity(pages.len());
        let mut runs: Vec<Range> = Vec::new();
        let mut sorted = Vec::with_capacity(pages.len());
        for &p in pages {
            if !seen.insert(p) {
                continue;
            }
            sorted.push(p);
            match runs.last_mut() {
                Some(last) if last.end() == p * ps => last.len += ps,
                _ => runs.push(Range {
                    offset: p * ps,
                    len: ps,
                }),
            }
        }
        sorted.sort_unstable();
        let mut ranges: Vec<Range> = Vec::new();
        for p in sorted {
            match ranges.last_mut() {
                Some(last) if last.end() == p * ps => last.len += ps,
                _ => ranges.push(Range {
                    offset: p * ps,
                    len: ps,
                }),
            }
        }
        Self {
            page_size,
            guest_memory_size,
            ranges,
            runs,
        }
    }

    /// Bytes of guest memory the manifest names.
    pub fn total_bytes(&self) -> u64 {
        self.ranges.iter().map(|r| r.len).sum()
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out =
            Vec::with_capacity(HEADER_LEN + ENTRY_LEN * (self.ranges.len() + self.runs.len()));
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&self.page_size.to_le_bytes());
        out.extend_from_slice(&self.guest_memory_size.to_le_bytes());
        out.extend_from_slice(&(self.ranges.len() as u32).to_le_bytes());
        out.extend_from_slice(&(self.runs.len() as u32).to_le_bytes());
        for r in self.ranges.iter().chain(&self.runs) {
            out.extend_from_slice(&r.offset.to_le_bytes());
            out.extend_from_slice(&r.len.to_le_bytes());
        }
        out
    }

    /// The descriptor of `encoded` (this manifest's [`Manifest::encode`]).
    pub fn descriptor(&self, encoded: &[u8]) -> ManifestDescriptor {
        ManifestDescriptor {
            version: VERSION,
            size: encoded.len() as u64,
            guest_memory_size: self.guest_memory_size,
            sha256: hex::encode(Sha256::digest(encoded)),
        }
    }

    /// Checks `bytes` against the descriptor and the snapshot's guest memory
    /// size, then decodes and validates the body.
    pub fn verify(
        bytes: &[u8],
        descriptor: &ManifestDescriptor,
        snapshot_memory_size: u64,
    ) -> Result<Self, ManifestError> {
        let actual = bytes.len() as u64;
        if actual > MAX_MANIFEST_BYTES {
            return Err(ManifestError::TooLarge {
                size: actual,
                max: MAX_MANIFEST_BYTES,
            });
        }
        if actual != descriptor.size {
            return Err(ManifestError::SizeMismatch {
                expected: descriptor.size,
                actual,
            });
        }
        let digest = hex::encode(Sha256::digest(bytes));
        if !digest.eq_ignore_ascii_case(&descriptor.sha256) {
            return Err(ManifestError::HashMismatch {
                expected: descriptor.sha256.clone(),
                actual: digest,
            });
        }
        let manifest = Self::decode(bytes)?;
        if descriptor.version != VERSION {
            return Err(ManifestError::DescriptorVersion {
                descriptor: descriptor.version,
                file: VERSION,
            });
        }
        for size in [descriptor.guest_memory_size, manifest.guest_memory_size] {
            if size != snapshot_memory_size {
                return Err(ManifestError::MemorySizeMismatch {
                    manifest: size,
                    snapshot: snapshot_memory_size,
                });
            }
        }
        Ok(manifest)
    }

    /// Decodes and validates the body (no descriptor check).
    pub fn decode(bytes: &[u8]) -> Result<Self, ManifestError> {
        if bytes.len() as u64 > MAX_MANIFEST_BYTES {
            return Err(ManifestError::TooLarge {
                size: bytes.len() as u64,
                max: MAX_MANIFEST_BYTES,
            });
        }
        if bytes.len() < HEADER_LEN {
            return Err(ManifestError::Truncated { len: bytes.len() });
        }
        if &bytes[..8] != MAGIC {
            return Err(ManifestError::BadMagic);
        }
        let version = u16_at(bytes, 8);
        if version != VERSION {
            return Err(ManifestError::UnsupportedVersion(version));
        }
        let flags = u16_at(bytes, 10);
        if flags != 0 {
            return Err(ManifestError::UnsupportedFlags(flags));
        }
        let page_size = u32_at(bytes, 12);
        if !page_size.is_power_of_two() || !(4096..=2 << 20).contains(&page_size) {
            return Err(ManifestError::BadPageSize(page_size));
        }
        let guest_memory_size = u64_at(bytes, 16);
        if guest_memory_size == 0 || !guest_memory_size.is_multiple_of(u64::from(page_size)) {
            return Err(ManifestError::BadMemorySize {
                size: guest_memory_size,
                page: page_size,
            });
        }
        let (nr, no) = (u32_at(bytes, 24), u32_at(bytes, 28));
        let expected = HEADER_LEN as u64 + ENTRY_LEN as u64 * (u64::from(nr) + u64::from(no));
        if expected != bytes.len() as u64 {
            return Err(ManifestError::LengthMismatch {
                ranges: nr,
                runs: no,
                expected,
                actual: bytes.len() as u64,
            });
        }
        let entry = |i: usize| {
            let at = HEADER_LEN + ENTRY_LEN * i;
            Range {
                offset: u64_at(bytes, at),
                len: u64_at(bytes, at + 8),
            }
        };
        let ranges: Vec<Range> = (0..nr as usize).map(entry).collect();
        let runs: Vec<Range> = (nr as usize..(nr + no) as usize).map(entry).collect();
        let m = Self {
            page_size,
            guest_memory_size,
            ranges,
            runs,
        };
        m.validate()?;
        Ok(m)
    }

    /// Checks the invariants of the format (see the module documentation).
    pub fn validate(&self) -> Result<(), ManifestError> {
        let ps = u64::from(self.page_size);
        for (what, list) in [("range", &self.ranges), ("run", &self.runs)] {
            for (index, r) in list.iter().enumerate() {
                if r.len == 0 || r.offset % ps != 0 || r.len % ps != 0 {
                    return Err(ManifestError::Unaligned {
                        what,
                        index,
                        offset: r.offset,
                        len: r.len,
                    });
                }
                match r.offset.checked_add(r.len) {
                    Some(end) if end <= self.guest_memory_size => {}
                    _ => {
                        return Err(ManifestError::OutOfBounds {
                            what,
                            index,
                            offset: r.offset,
                            len: r.len,
                        })
                    }
                }
            }
        }
        for (i, pair) in self.ranges.windows(2).enumerate() {
            if pair[1].offset <= pair[0].end() {
                return Err(ManifestError::RangesNotMerged(i + 1));
            }
        }
        // Sorted runs must tile the ranges exactly: same total, no overlap,
        // and each merged stretch of runs equal to one range.
        let mut sorted = self.runs.clone();
        sorted.sort_unstable();
        let mut merged: Vec<Range> = Vec::with_capacity(self.ranges.len());
        for r in sorted {
            match merged.last_mut() {
                Some(last) if r.offset < last.end() => return Err(ManifestError::RunsMismatch),
                Some(last) if r.offset == last.end() => last.len += r.len,
                _ => merged.push(r),
            }
        }
        if merged != self.ranges {
            return Err(ManifestError::RunsMismatch);
        }
        Ok(())
    }
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}
