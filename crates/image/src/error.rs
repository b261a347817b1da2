//! Errors of image handling. Each says which image, blob or file, and what
//! to do about it where there is something to do.

use std::path::PathBuf;

/// What went wrong while fetching or unpacking an image.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("invalid image reference `{reference}`: {reason}")]
    InvalidReference { reference: String, reason: String },
    #[error("image `{reference}` was not found in its registry (check the name and tag)")]
    NotFound { reference: String },
    #[error("the registry refused access to `{reference}`: {detail} (check the registry user and password)")]
    AuthFailed { reference: String, detail: String },
    #[error("the registry of `{reference}` cannot be reached: {detail}")]
    Unreachable { reference: String, detail: String },
    #[error("pulling `{reference}` failed: {detail}")]
    Registry { reference: String, detail: String },
    /// A connection the pull's [`crate::Reach`] does not allow (an API
    /// build's registry, token service or redirect at a loopback, private
    /// or link-local address).
    #[error("pulling `{reference}` is refused: {refused}")]
    Forbidden {
        reference: String,
        refused: crate::reach::AddressRefused,
    },
    #[error("image `{reference}` has no linux/amd64 variant")]
    NoPlatform { reference: String },
    #[error("image `{reference}` is not usable: {detail}")]
    Unsupported { reference: String, detail: String },
    #[error("blob {digest} does not match its digest (got sha256:{actual}); it was not kept")]
    DigestMismatch { digest: String, actual: String },
    #[error("layer {digest}: {detail}")]
    BadLayer { digest: String, detail: String },
    /// Over one of [`crate::ImageLimits`]: `subject` is the image or layer,
    /// `detail` says which limit and its value.
    #[error("{subject}: {detail}")]
    TooLarge { subject: String, detail: String },
    #[error("{what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T, E = ImageError> = std::result::Result<T, E>;

/// Adds which file an I/O error was about.
pub(crate) trait IoContext<T> {
    fn ctx(self, what: &'static str, path: impl Into<PathBuf>) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn ctx(self, what: &'static str, path: impl Into<PathBuf>) -> Result<T> {
        self.map_err(|source| ImageError::Io {
            what,
            path: path.into(),
            source,
        })
    }
}

/// An error with its causes, one after another (`oci-client` and `tar`
/// wrap the system's errors).
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
