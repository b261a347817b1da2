//! Pulling from a registry with `oci-client`: the manifest (picking
//! linux/amd64 from an index, read by `manifest.rs` with a size cap) and
//! config every time, since tags move; each layer only when the blob cache
//! lacks its digest. No blob is read past the size its manifest declares
//! (see [`ImageLimits`]).

use std::time::Duration;

use oci_client::client::{linux_amd64_resolver, ClientConfig, ClientProtocol};
use oci_client::errors::{OciDistributionError, OciErrorCode};
use oci_client::manifest::OciDescriptor;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference, RegistryOperation};

use crate::config::ImageConfig;
use crate::error::{chain, ImageError, IoContext, Result};
use crate::limits::{size_text, ImageLimits};
use crate::manifest::{Auth, ManifestClient};
use crate::source::FetchOptions;
use crate::store::BlobStore;
use crate::{Image, Progress, ProgressEvent};

/// Layer media types we can unpack (compression is detected from the bytes).
const LAYER_TYPES: &[&str] = &[
    oci_client::manifest::IMAGE_LAYER_MEDIA_TYPE,
    oci_client::manifest::IMAGE_LAYER_GZIP_MEDIA_TYPE,
    oci_client::manifest::IMAGE_DOCKER_LAYER_TAR_MEDIA_TYPE,
    oci_client::manifest::IMAGE_DOCKER_LAYER_GZIP_MEDIA_TYPE,
];

pub(crate) async fn pull(
    reference: &Reference,
    opts: &FetchOptions,
    store: &BlobStore,
    progress: Progress<'_>,
) -> Result<Image> {
    let whole = reference.whole();
    let plain_http = opts.plain_http(reference.registry());
    let client = Client::new(ClientConfig {
        protocol: if plain_http {
            ClientProtocol::Http
        } else {
            ClientProtocol::Https
        },
        platform_resolver: Some(Box::new(linux_amd64_resolver)),
        connect_timeout: Some(Duration::from_secs(10)),
        read_timeout: Some(Duration::from_secs(120)),
        ..Default::default()
    });
    let auth = match &opts.credentials {
        Some(c) => RegistryAuth::Basic(c.username.clone(), c.password.clone()),
        None => RegistryAuth::Anonymous,
    };
    progress(ProgressEvent::Line(&format!("resolving {whole}")));
    // The token is cached in `client` for the blob pulls below; the
    // manifest is read by `manifest.rs`, which caps its size.
    let token = client
        .auth(reference, &auth, RegistryOperation::Pull)
        .await
        .map_err(|e| classify(&whole, e))?;
    let manifest_auth = match (token, &opts.credentials) {
        (Some(token), _) => Auth::Bearer(token),
        (None, Some(c)) => Auth::Basic(c.username.clone(), c.password.clone()),
        (None, None) => Auth::Anonymous,
    };
    let (manifest, digest) = ManifestClient::new(plain_http, manifest_auth)?
        .image_manifest(reference, &opts.limits, linux_amd64_resolver)
        .await?;
    let config_json = fetch_config(&client, reference, &manifest.config, &opts.limits).await?;
    let config = ImageConfig::parse(&config_json).map_err(|e| ImageError::Unsupported {
        reference: whole.clone(),
        detail: format!("its config is not an image config: {e}"),
    })?;
    let mut image = Image::new(whole.clone(), digest, config);
    for (i, layer) in manifest.layers.iter().enumerate() {
        check_layer_type(&whole, layer)?;
        let size = declared_size(&whole, layer, &opts.limits)?;
        let label = format!(
            "layer {}/{} {} ({})",
            i + 1,
            manifest.layers.len(),
            short(&layer.digest),
            human(layer.size)
        );
        if store.contains(&layer.digest) {
            progress(ProgressEvent::Line(&format!("{label}: cached")));
            image.cached_layers += 1;
        } else {
            progress(ProgressEvent::Line(&format!("{label}: pulling")));
            fetch_layer(&client, reference, layer, size, store, progress).await?;
            image.fetched_layers += 1;
            image.fetched_bytes += size;
        }
        image.layers.push(layer.digest.clone());
    }
    Ok(image)
}

/// A layer's size as its manifest declares it, refused when negative or
/// over [`ImageLimits::max_layer_bytes`] (before a byte is pulled).
fn declared_size(whole: &str, layer: &OciDescriptor, limits: &ImageLimits) -> Result<u64> {
    let size = u64::try_from(layer.size).map_err(|_| ImageError::Unsupported {
        reference: whole.to_string(),
        detail: format!(
            "layer {} declares a negative size ({})",
            short(&layer.digest),
            layer.size
        ),
    })?;
    if size > limits.max_layer_bytes {
        return Err(ImageError::TooLarge {
            subject: format!("image `{whole}`"),
            detail: format!(
                "layer {} is {}, over the limit of {} on one layer",
                short(&layer.digest),
                size_text(size),
                size_text(limits.max_layer_bytes)
            ),
        });
    }
    Ok(size)
}

/// The image config, at most its declared size and at most
/// [`ImageLimits::max_manifest_bytes`].
async fn fetch_config(
    client: &Client,
    reference: &Reference,
    config: &OciDescriptor,
    limits: &ImageLimits,
) -> Result<Vec<u8>> {
    let whole = reference.whole();
    let size = u64::try_from(config.size).unwrap_or(u64::MAX);
    if size > limits.max_manifest_bytes {
        return Err(ImageError::TooLarge {
            subject: format!("image `{whole}`"),
            detail: format!(
                "its config is {}, over the limit of {} on manifests and configs",
                size_text(size),
                size_text(limits.max_manifest_bytes)
            ),
        });
    }
    let mut out = Bounded::new(Vec::new(), size, None);
    match client.pull_blob(reference, config, &mut out).await {
        Ok(()) => Ok(out.inner),
        Err(_) if out.over => Err(longer_than_declared(&whole, "its config", size)),
        Err(e) => Err(classify(&whole, e)),
    }
}

fn longer_than_declared(whole: &str, what: &str, size: u64) -> ImageError {
    ImageError::TooLarge {
        subject: format!("image `{whole}`"),
        detail: format!(
            "{what} is longer than the {} its manifest declares; the download was stopped",
            size_text(size)
        ),
    }
}

async fn fetch_layer(
    client: &Client,
    reference: &Reference,
    layer: &OciDescriptor,
    size: u64,
    store: &BlobStore,
    progress: Progress<'_>,
) -> Result<()> {
    let tmp = store.temp_path();
    let file = tokio::fs::File::create(&tmp)
        .await
        .ctx("creating a layer download", &tmp)?;
    let label = short(&layer.digest).to_string();
    let mut out = Bounded::new(file, size, Some((label, progress)));
    let pulled = client.pull_blob(reference, layer, &mut out).await;
    let over = out.over;
    drop(out);
    if let Err(e) = pulled {
        let _ = tokio::fs::remove_file(&tmp).await;
        return Err(if over {
            longer_than_declared(
                &reference.whole(),
                &format!("layer {}", short(&layer.digest)),
                size,
            )
        } else {
            classify(&reference.whole(), e)
        });
    }
    let store = store.clone();
    let digest = layer.digest.clone();
    tokio::task::spawn_blocking(move || store.commit(&tmp, &digest))
        .await
        .map_err(|e| ImageError::Registry {
            reference: reference.whole(),
            detail: format!("verifying a layer stopped: {e}"),
        })??;
    Ok(())
}

/// A download's writer that refuses bytes past `limit` (the size the
/// manifest declares, so an endless blob stops there) and, for a layer,
/// reports its bytes every [`REPORT_EVERY`].
struct Bounded<'a, W> {
    inner: W,
    limit: u64,
    done: u64,
    /// Set when the blob went past `limit`: the pull's error is this one.
    over: bool,
    reported: u64,
    progress: Option<(String, Progress<'a>)>,
}

const REPORT_EVERY: u64 = 4 << 20;

impl<'a, W> Bounded<'a, W> {
    fn new(inner: W, limit: u64, progress: Option<(String, Progress<'a>)>) -> Self {
        Self {
            inner,
            limit,
            done: 0,
            over: false,
            reported: 0,
            progress,
        }
    }

    fn report(&mut self) {
        self.reported = self.done;
        if let Some((layer, progress)) = &self.progress {
            progress(ProgressEvent::Bytes {
                layer,
                done: self.done,
                total: self.limit,
            });
        }
    }
}

impl<W: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Bounded<'_, W> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        if self.done + buf.len() as u64 > self.limit {
            self.over = true;
            return std::task::Poll::Ready(Err(std::io::Error::other(
                "the blob is longer than its manifest declares",
            )));
        }
        let polled = std::pin::Pin::new(&mut self.inner).poll_write(cx, buf);
        if let std::task::Poll::Ready(Ok(n)) = &polled {
            self.done += *n as u64;
            if self.done - self.reported >= REPORT_EVERY || self.done == self.limit {
                self.report();
            }
        }
        polled
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

fn check_layer_type(reference: &str, layer: &OciDescriptor) -> Result<()> {
    if LAYER_TYPES.contains(&layer.media_type.as_str()) || layer.media_type.is_empty() {
        return Ok(());
    }
    let why = if layer.media_type.contains("zstd") {
        "zstd-compressed layers are not supported yet; push the image with gzip layers (skopeo copy --dest-compress-format gzip)"
    } else if layer.media_type.contains("nondistributable") || layer.media_type.contains("foreign")
    {
        "non-distributable (foreign) layers are not supported"
    } else {
        "it is not a filesystem layer"
    };
    Err(ImageError::Unsupported {
        reference: reference.to_string(),
        detail: format!(
            "layer {} has media type {}: {why}",
            short(&layer.digest),
            layer.media_type
        ),
    })
}

/// Turns a client error into one that says what the user can do.
fn classify(reference: &str, e: OciDistributionError) -> ImageError {
    let reference = reference.to_string();
    let detail = e.to_string();
    match &e {
        OciDistributionError::ImageManifestNotFoundError(m) if m.contains("platform") => {
            ImageError::NoPlatform { reference }
        }
        OciDistributionError::ImageManifestNotFoundError(_) => ImageError::NotFound { reference },
        OciDistributionError::AuthenticationFailure(_)
        | OciDistributionError::UnauthorizedError { .. } => {
            ImageError::AuthFailed { reference, detail }
        }
        OciDistributionError::RegistryError { envelope, .. } => {
            let codes: Vec<&OciErrorCode> = envelope.errors.iter().map(|e| &e.code).collect();
            if codes.iter().any(|c| {
                matches!(
                    c,
                    OciErrorCode::ManifestUnknown
                        | OciErrorCode::NameUnknown
                        | OciErrorCode::NotFound
                )
            }) {
                ImageError::NotFound { reference }
            } else if codes
                .iter()
                .any(|c| matches!(c, OciErrorCode::Unauthorized | OciErrorCode::Denied))
            {
                ImageError::AuthFailed { reference, detail }
            } else {
                ImageError::Registry { reference, detail }
            }
        }
        OciDistributionError::ServerError { code: 404, .. } => ImageError::NotFound { reference },
        OciDistributionError::ServerError {
            code: 401 | 403, ..
        } => ImageError::AuthFailed { reference, detail },
        OciDistributionError::RequestError(r) if r.is_connect() || r.is_timeout() => {
            ImageError::Unreachable {
                reference,
                detail: chain(r),
            }
        }
        _ => ImageError::Registry { reference, detail },
    }
}

pub(crate) fn short(digest: &str) -> &str {
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
    &hex[..hex.len().min(12)]
}

pub(crate) fn human(bytes: i64) -> String {
    let b = bytes.max(0) as f64;
    if b >= 1024.0 * 1024.0 {
        format!("{:.1} MiB", b / 1024.0 / 1024.0)
    } else {
        format!("{:.1} KiB", b / 1024.0)
    }
}
