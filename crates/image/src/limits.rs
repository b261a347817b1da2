//! How much one image may make the node download and write.
//!
//! A registry is not trusted: it could send an endless manifest or blob,
//! and a small layer can be a gzip bomb that unpacks to far more than the
//! disk holds. Each cap below fails the fetch or the unpack with
//! [`crate::ImageError::TooLarge`], which names it.

/// Caps on fetching and unpacking one image. `Default` gives the values
/// documented on each field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageLimits {
    /// Most bytes of a manifest, an index or an image config from a
    /// registry (4 MiB; real ones are a few KiB).
    pub max_manifest_bytes: u64,
    /// Most bytes of one layer blob as pulled, compressed (16 GiB). A blob
    /// must also be no longer than the size its manifest declares.
    pub max_layer_bytes: u64,
    /// Most bytes the layers of one image unpack to, summed over its layers
    /// by the sizes their tar entries give (16 GiB; sparse files count by
    /// their apparent size).
    pub max_unpacked_bytes: u64,
    /// Most tar entries (files, directories, links, whiteouts) in the
    /// layers of one image, summed over its layers (1,000,000).
    pub max_entries: u64,
}

impl ImageLimits {
    pub const DEFAULT: Self = Self {
        max_manifest_bytes: 4 << 20,
        max_layer_bytes: 16 << 30,
        max_unpacked_bytes: 16 << 30,
        max_entries: 1_000_000,
    };
}

impl Default for ImageLimits {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// `512 bytes`, `3.5 MiB`, `16.0 GiB`: a size for a message.
pub(crate) fn size_text(bytes: u64) -> String {
    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;
    if bytes >= GIB {
        format!("{:.1} GiB", bytes as f64 / GIB as f64)
    } else if bytes >= MIB {
        format!("{:.1} MiB", bytes as f64 / MIB as f64)
    } else {
        format!("{bytes} bytes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(size_text(512), "512 bytes");
        assert_eq!(size_text(4 << 20), "4.0 MiB");
        assert_eq!(size_text(16 << 30), "16.0 GiB");
    }
}
