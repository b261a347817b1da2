//! Pulling from a registry with `oci-client`: the manifest (picking
//! linux/amd64 from an index) and config every time, since tags move; each
//! layer only when the blob cache lacks its digest.

use std::time::Duration;

use oci_client::client::{linux_amd64_resolver, ClientConfig, ClientProtocol};
use oci_client::errors::{OciDistributionError, OciErrorCode};
use oci_client::manifest::OciDescriptor;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};

use crate::config::ImageConfig;
use crate::error::{chain, ImageError, IoContext, Result};
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
    let client = Client::new(ClientConfig {
        protocol: if opts.plain_http(reference.registry()) {
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
    let (manifest, digest, config_json) = client
        .pull_manifest_and_config(reference, &auth)
        .await
        .map_err(|e| classify(&whole, e))?;
    let config =
        ImageConfig::parse(config_json.as_bytes()).map_err(|e| ImageError::Unsupported {
            reference: whole.clone(),
            detail: format!("its config is not an image config: {e}"),
        })?;
    let mut image = Image::new(whole.clone(), digest, config);
    for (i, layer) in manifest.layers.iter().enumerate() {
        check_layer_type(&whole, layer)?;
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
            fetch_layer(&client, reference, layer, store, progress).await?;
            image.fetched_layers += 1;
            image.fetched_bytes += u64::try_from(layer.size).unwrap_or(0);
        }
        image.layers.push(layer.digest.clone());
    }
    Ok(image)
}

async fn fetch_layer(
    client: &Client,
    reference: &Reference,
    layer: &OciDescriptor,
    store: &BlobStore,
    progress: Progress<'_>,
) -> Result<()> {
    let tmp = store.temp_path();
    let file = tokio::fs::File::create(&tmp)
        .await
        .ctx("creating a layer download", &tmp)?;
    let counted = Counting {
        inner: file,
        layer: short(&layer.digest).to_string(),
        done: 0,
        reported: 0,
        total: u64::try_from(layer.size).unwrap_or(0),
        progress,
    };
    if let Err(e) = client.pull_blob(reference, layer, counted).await {
        let _ = tokio::fs::remove_file(&tmp).await;
        return Err(classify(&reference.whole(), e));
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

/// A download's writer that reports its bytes every [`REPORT_EVERY`].
struct Counting<'a> {
    inner: tokio::fs::File,
    layer: String,
    done: u64,
    reported: u64,
    total: u64,
    progress: Progress<'a>,
}

const REPORT_EVERY: u64 = 4 << 20;

impl Counting<'_> {
    fn report(&mut self) {
        self.reported = self.done;
        (self.progress)(ProgressEvent::Bytes {
            layer: &self.layer,
            done: self.done,
            total: self.total,
        });
    }
}

impl tokio::io::AsyncWrite for Counting<'_> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_write(cx, buf);
        if let std::task::Poll::Ready(Ok(n)) = &polled {
            self.done += *n as u64;
            if self.done - self.reported >= REPORT_EVERY || self.done == self.total {
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
