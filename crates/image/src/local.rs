//! Images on the local disk: an OCI image layout directory, or a
//! docker-archive tarball. Their blobs are copied into the cache (verified
//! against their digests) like pulled ones.

use std::fs::File;
use std::io::Read;
use std::path::{Component, Path, PathBuf};

use serde_json::Value;

use crate::config::ImageConfig;
use crate::error::{ImageError, IoContext, Result};
use crate::store::BlobStore;
use crate::{Image, Progress, ProgressEvent};

const REF_NAME: &str = "org.opencontainers.image.ref.name";

/// Reads image `tag` (or the only image) of the OCI layout in `dir`.
pub(crate) fn read_layout(
    dir: &Path,
    tag: Option<&str>,
    store: &BlobStore,
    progress: Progress<'_>,
) -> Result<Image> {
    let name = match tag {
        Some(t) => format!("oci:{}:{t}", dir.display()),
        None => format!("oci:{}", dir.display()),
    };
    let unusable = |detail: String| ImageError::Unsupported {
        reference: name.clone(),
        detail,
    };
    let index_path = dir.join("index.json");
    let index: Value = serde_json::from_slice(
        &std::fs::read(&index_path).ctx("reading the OCI layout's index", &index_path)?,
    )
    .map_err(|e| unusable(format!("index.json is not JSON: {e}")))?;
    let entries = index["manifests"].as_array().cloned().unwrap_or_default();
    let entry = pick_entry(&entries, tag).map_err(unusable)?;
    let mut digest = str_field(&entry, "digest").map_err(unusable)?;
    let mut manifest = layout_json(dir, &digest, store).map_err(|e| named(e, &name))?;
    // An index (multi-platform) points to one manifest per platform.
    if manifest.get("manifests").is_some() {
        let platforms = manifest["manifests"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let chosen = platforms
            .iter()
            .find(|m| m["platform"]["os"] == "linux" && m["platform"]["architecture"] == "amd64")
            .ok_or_else(|| ImageError::NoPlatform {
                reference: name.clone(),
            })?;
        digest = str_field(chosen, "digest").map_err(unusable)?;
        manifest = layout_json(dir, &digest, store).map_err(|e| named(e, &name))?;
    }
    let config_digest = str_field(&manifest["config"], "digest").map_err(unusable)?;
    let config_bytes = copy_blob(dir, &config_digest, store)?;
    let config = ImageConfig::parse(&config_bytes)
        .map_err(|e| unusable(format!("its config is not an image config: {e}")))?;
    let mut image = Image::new(name.clone(), digest, config);
    let layers = manifest["layers"].as_array().cloned().unwrap_or_default();
    for (i, layer) in layers.iter().enumerate() {
        let d = str_field(layer, "digest").map_err(unusable)?;
        if store.contains(&d) {
            image.cached_layers += 1;
            progress(ProgressEvent::Line(&format!(
                "layer {}/{}: cached",
                i + 1,
                layers.len()
            )));
        } else {
            progress(ProgressEvent::Line(&format!(
                "layer {}/{}: copying",
                i + 1,
                layers.len()
            )));
            let p = blob_path(dir, &d)?;
            let mut f = File::open(&p).ctx("opening a layer of the OCI layout", &p)?;
            store.insert(&mut f, Some(&d))?;
            image.fetched_layers += 1;
            image.fetched_bytes += layer["size"].as_u64().unwrap_or(0);
        }
        image.layers.push(d);
    }
    Ok(image)
}

fn pick_entry(entries: &[Value], tag: Option<&str>) -> std::result::Result<Value, String> {
    let tags: Vec<&str> = entries
        .iter()
        .filter_map(|e| e["annotations"][REF_NAME].as_str())
        .collect();
    match tag {
        Some(t) => entries
            .iter()
            .find(|e| {
                e["annotations"][REF_NAME]
                    .as_str()
                    .is_some_and(|n| n == t || n.ends_with(&format!(":{t}")))
            })
            .cloned()
            .ok_or_else(|| {
                format!(
                    "the layout has no image tagged `{t}` (it has: {})",
                    tags.join(", ")
                )
            }),
        None if entries.len() == 1 => Ok(entries[0].clone()),
        None if entries.is_empty() => Err("the layout holds no image".into()),
        None => Err(format!(
            "the layout holds {} images; name one as oci:DIR:TAG (tags: {})",
            entries.len(),
            tags.join(", ")
        )),
    }
}

fn str_field(v: &Value, field: &str) -> std::result::Result<String, String> {
    v[field]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| format!("a descriptor lacks its `{field}`"))
}

fn named(e: ImageError, name: &str) -> ImageError {
    match e {
        ImageError::BadLayer { digest, detail } => ImageError::Unsupported {
            reference: name.to_string(),
            detail: format!("blob {digest}: {detail}"),
        },
        other => other,
    }
}

fn blob_path(dir: &Path, digest: &str) -> Result<PathBuf> {
    let (alg, hex) = digest.split_once(':').unwrap_or(("", ""));
    if alg != "sha256" || hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(ImageError::BadLayer {
            digest: digest.to_string(),
            detail: "not a sha256 digest".into(),
        });
    }
    Ok(dir.join("blobs").join(alg).join(hex))
}

/// Copies blob `digest` of the layout into the store (verifying it) and
/// returns its bytes; for manifests and configs, which are small.
fn copy_blob(dir: &Path, digest: &str, store: &BlobStore) -> Result<Vec<u8>> {
    if !store.contains(digest) {
        let p = blob_path(dir, digest)?;
        let mut f = File::open(&p).ctx("opening a blob of the OCI layout", &p)?;
        store.insert(&mut f, Some(digest))?;
    }
    store.read(digest)
}

fn layout_json(dir: &Path, digest: &str, store: &BlobStore) -> Result<Value> {
    let bytes = copy_blob(dir, digest, store)?;
    serde_json::from_slice(&bytes).map_err(|e| ImageError::BadLayer {
        digest: digest.to_string(),
        detail: format!("not a JSON manifest: {e}"),
    })
}

/// Reads the (single) image of a docker-archive tarball. Its identity is
/// the digest of its config, as Docker's image id is.
pub(crate) fn read_docker_archive(
    path: &Path,
    store: &BlobStore,
    progress: Progress<'_>,
) -> Result<Image> {
    let name = format!("docker-archive:{}", path.display());
    let unusable = |detail: String| ImageError::Unsupported {
        reference: name.clone(),
        detail,
    };
    let manifest = archive_member(path, "manifest.json")?.ok_or_else(|| {
        unusable("it has no manifest.json (is it a `docker save` tarball?)".into())
    })?;
    let manifest: Value = serde_json::from_slice(&manifest)
        .map_err(|e| unusable(format!("manifest.json is not JSON: {e}")))?;
    let images = manifest.as_array().cloned().unwrap_or_default();
    let [entry] = images.as_slice() else {
        return Err(unusable(format!(
            "it holds {} images; only archives of one image are supported",
            images.len()
        )));
    };
    let config_name = entry["Config"]
        .as_str()
        .ok_or_else(|| unusable("manifest.json names no Config".into()))?
        .to_string();
    let layer_names: Vec<String> = entry["Layers"]
        .as_array()
        .map(|a| a.iter().filter_map(|l| l.as_str().map(normal)).collect())
        .unwrap_or_default();
    let config_bytes = archive_member(path, &config_name)?
        .ok_or_else(|| unusable(format!("its config {config_name} is missing")))?;
    let config = ImageConfig::parse(&config_bytes)
        .map_err(|e| unusable(format!("its config is not an image config: {e}")))?;
    let digest = store.insert(&mut config_bytes.as_slice(), None)?;
    let mut image = Image::new(name.clone(), digest, config);
    let digests = copy_archive_layers(path, &layer_names, store, progress)?;
    for l in &layer_names {
        let d = digests
            .iter()
            .find(|(n, _)| n == l)
            .map(|(_, d)| d.clone())
            .ok_or_else(|| unusable(format!("layer {l} is missing from the archive")))?;
        image.layers.push(d);
    }
    image.fetched_layers = image.layers.len();
    Ok(image)
}

/// Copies every member named in `layers` into the store, in one pass.
fn copy_archive_layers(
    path: &Path,
    layers: &[String],
    store: &BlobStore,
    progress: Progress<'_>,
) -> Result<Vec<(String, String)>> {
    let file = File::open(path).ctx("opening the docker archive", path)?;
    let mut archive = tar::Archive::new(file);
    let mut found = Vec::new();
    for entry in archive.entries().ctx("reading the docker archive", path)? {
        let mut entry = entry.ctx("reading the docker archive", path)?;
        let member = normal(
            &entry
                .path()
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default(),
        );
        if layers.contains(&member) && !found.iter().any(|(n, _)| n == &member) {
            progress(ProgressEvent::Line(&format!(
                "layer {}/{}: copying",
                found.len() + 1,
                layers.len()
            )));
            let digest = store.insert(&mut entry, None)?;
            found.push((member, digest));
        }
    }
    Ok(found)
}

/// The bytes of member `name` of the tarball at `path`, if it has one.
fn archive_member(path: &Path, name: &str) -> Result<Option<Vec<u8>>> {
    let file = File::open(path).ctx("opening the docker archive", path)?;
    let mut archive = tar::Archive::new(file);
    let want = normal(name);
    for entry in archive.entries().ctx("reading the docker archive", path)? {
        let mut entry = entry.ctx("reading the docker archive", path)?;
        if normal(
            &entry
                .path()
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default(),
        ) == want
        {
            let mut bytes = Vec::new();
            entry
                .read_to_end(&mut bytes)
                .ctx("reading the docker archive", path)?;
            return Ok(Some(bytes));
        }
    }
    Ok(None)
}

/// A member name without `./` or leading `/`.
fn normal(name: &str) -> String {
    Path::new(name)
        .components()
        .filter_map(|c| match c {
            Component::Normal(p) => Some(p.to_string_lossy().into_owned()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("/")
}
