//! Pulling from a registry: the manifest (picking linux/amd64 from an
//! index, read by `manifest.rs` with a size cap) and config every time,
//! since tags move; each layer only when the blob cache lacks its digest.
//! No blob is read past the size its manifest declares (see
//! [`ImageLimits`]). Every request goes through the pull's
//! [`RegistryClient`], which keeps it within the pull's [`crate::Reach`].

use oci_client::client::linux_amd64_resolver;
use oci_client::manifest::OciDescriptor;
use oci_client::Reference;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncWrite, AsyncWriteExt};

use crate::client::{read_small, request_error, RegistryClient};
use crate::config::ImageConfig;
use crate::error::{ImageError, IoContext, Result};
use crate::limits::{size_text, ImageLimits};
use crate::manifest::refusal;
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

/// How often a layer download reports its bytes.
const REPORT_EVERY: u64 = 4 << 20;

pub(crate) async fn pull(
    reference: &Reference,
    opts: &FetchOptions,
    store: &BlobStore,
    progress: Progress<'_>,
) -> Result<Image> {
    let whole = reference.whole();
    progress(ProgressEvent::Line(&format!("resolving {whole}")));
    let client = RegistryClient::connect(reference, opts).await?;
    let (manifest, digest) = client
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
/// [`ImageLimits::max_manifest_bytes`], checked against its digest.
async fn fetch_config(
    client: &RegistryClient,
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
    if !config.digest.starts_with("sha256:") {
        return Err(ImageError::Unsupported {
            reference: whole,
            detail: format!(
                "its config digest {} is not a sha256 one (the only kind supported)",
                config.digest
            ),
        });
    }
    let mut out = Vec::new();
    download(
        client,
        reference,
        config,
        size,
        &mut out,
        "its config",
        None,
    )
    .await?;
    let actual = hex::encode(Sha256::digest(&out));
    if format!("sha256:{actual}") != config.digest.to_ascii_lowercase() {
        return Err(ImageError::DigestMismatch {
            digest: config.digest.clone(),
            actual,
        });
    }
    Ok(out)
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
    client: &RegistryClient,
    reference: &Reference,
    layer: &OciDescriptor,
    size: u64,
    store: &BlobStore,
    progress: Progress<'_>,
) -> Result<()> {
    let tmp = store.temp_path();
    let mut file = tokio::fs::File::create(&tmp)
        .await
        .ctx("creating a layer download", &tmp)?;
    let label = short(&layer.digest).to_string();
    let what = format!("layer {label}");
    let pulled = download(
        client,
        reference,
        layer,
        size,
        &mut file,
        &what,
        Some((&label, progress)),
    )
    .await;
    drop(file);
    if let Err(e) = pulled {
        let _ = tokio::fs::remove_file(&tmp).await;
        return Err(e);
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

/// Streams blob `blob` into `out`, refusing bytes past `limit` (the size
/// its manifest declares, so an endless blob stops there); for a layer,
/// reports its bytes every [`REPORT_EVERY`] and at its end. `what` names
/// the blob in errors.
async fn download<W: AsyncWrite + Unpin>(
    client: &RegistryClient,
    reference: &Reference,
    blob: &OciDescriptor,
    limit: u64,
    out: &mut W,
    what: &str,
    progress: Option<(&str, Progress<'_>)>,
) -> Result<()> {
    let whole = reference.whole();
    let url = format!(
        "{}/v2/{}/blobs/{}",
        client.base(reference),
        reference.repository(),
        blob.digest
    );
    let mut response = client.get(reference, &url, None).await?;
    let status = response.status();
    if !status.is_success() {
        let body = read_small(&mut response, &whole).await?.unwrap_or_default();
        return Err(refusal(&whole, status.as_u16(), &body));
    }
    let write_err = |e: std::io::Error| ImageError::Registry {
        reference: whole.clone(),
        detail: format!("writing {what}: {e}"),
    };
    let report = |done: u64| {
        if let Some((layer, progress)) = progress {
            progress(ProgressEvent::Bytes {
                layer,
                done,
                total: limit,
            });
        }
    };
    let (mut done, mut reported) = (0u64, 0u64);
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| request_error(&whole, &e))?
    {
        if done + chunk.len() as u64 > limit {
            return Err(longer_than_declared(&whole, what, limit));
        }
        out.write_all(&chunk).await.map_err(write_err)?;
        done += chunk.len() as u64;
        if done - reported >= REPORT_EVERY || done == limit {
            reported = done;
            report(done);
        }
    }
    out.flush().await.map_err(write_err)?;
    Ok(())
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
