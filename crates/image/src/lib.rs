//! OCI images as template sources.
//!
//! [`fetch`] brings an image's config and layers into a [`BlobStore`] (a
//! cache by digest: a layer already there is not fetched again), from a
//! registry (as far as its [`Reach`] lets it connect) or from a local OCI
//! layout or docker-archive. [`unpack_layers`] then applies the layers, whiteouts
//! included, to a directory that becomes the template's root file system.
//!
//! ```text
//! ImageSource::parse("127.0.0.1:5000/team/py:3.12")
//!   └─ fetch ──> Image { digest, config, layers }   blobs in BlobStore
//!                  └─ unpack_layers(store, &image.layers, root)
//! ```

mod client;
mod config;
mod error;
mod limits;
mod local;
mod manifest;
mod reach;
mod registry;
mod source;
mod store;
mod unpack;

pub use config::ImageConfig;
pub use error::{ImageError, Result};
pub use limits::ImageLimits;
pub use reach::{closed_range, AddressRefused, IpNet, Reach, ALLOW_ENV, ALLOW_SETTING};
pub use source::{Credentials, FetchOptions, ImageSource};
pub use store::{hash_file, BlobStore};
pub use unpack::{unpack_layers, UnpackStats};

/// What a fetch reports as it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgressEvent<'a> {
    /// A line for the build log (`layer 2/5 1a2b3c (12.3 MiB): pulling`).
    Line(&'a str),
    /// Bytes of a layer written so far (every few MiB and at its end), for
    /// a progress bar.
    Bytes {
        layer: &'a str,
        done: u64,
        total: u64,
    },
}

/// Receives progress events.
pub type Progress<'a> = &'a (dyn Fn(ProgressEvent<'_>) + Send + Sync);

/// An image whose config is parsed and whose layers are in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// The source as the user named it, normalized (`docker.io/library/debian:12`).
    pub reference: String,
    /// What the image is, whatever its name: the manifest digest (for a
    /// docker-archive, the config digest, as Docker's image id).
    pub digest: String,
    pub config: ImageConfig,
    /// Layer digests, lowest first.
    pub layers: Vec<String>,
    /// Layers fetched (or copied) by this call, and layers found cached.
    pub fetched_layers: usize,
    pub cached_layers: usize,
    pub fetched_bytes: u64,
}

impl Image {
    fn new(reference: String, digest: String, config: ImageConfig) -> Self {
        Self {
            reference,
            digest,
            config,
            layers: Vec::new(),
            fetched_layers: 0,
            cached_layers: 0,
            fetched_bytes: 0,
        }
    }
}

/// Brings `source` into `store`. Local sources are read on a blocking
/// thread; registry pulls are asynchronous.
pub async fn fetch(
    source: &ImageSource,
    opts: &FetchOptions,
    store: &BlobStore,
    progress: Progress<'_>,
) -> Result<Image> {
    match source {
        ImageSource::Registry(reference) => registry::pull(reference, opts, store, progress).await,
        ImageSource::OciLayout { dir, tag } => {
            tokio::task::block_in_place(|| local::read_layout(dir, tag.as_deref(), store, progress))
        }
        ImageSource::DockerArchive { path } => {
            tokio::task::block_in_place(|| local::read_docker_archive(path, store, progress))
        }
    }
}
