//! Reading an image's manifest from a registry with a size cap.
//!
//! `oci-client` reads a manifest response whole into memory, however long
//! the registry makes it; a hostile registry could send one without end.
//! So the manifest (and, for a multi-arch image, its index) is fetched here
//! with the same URL, `Accept` types and credentials, streamed, and refused
//! past [`ImageLimits::max_manifest_bytes`]. Authentication (the token
//! dance) stays with `oci-client`, which caches the token for the blob pulls
//! that follow.

use std::time::Duration;

use oci_client::manifest::{
    OciImageManifest, OciManifest, IMAGE_MANIFEST_LIST_MEDIA_TYPE, IMAGE_MANIFEST_MEDIA_TYPE,
    OCI_IMAGE_INDEX_MEDIA_TYPE, OCI_IMAGE_MEDIA_TYPE,
};
use oci_client::Reference;
use sha2::{Digest, Sha256};

use crate::error::{chain, ImageError, Result};
use crate::limits::{size_text, ImageLimits};

/// The most of an error response kept for the message.
const ERROR_BODY_MAX: u64 = 16 << 10;

/// How a request to the registry is made: its scheme and credentials.
pub(crate) struct ManifestClient {
    http: reqwest::Client,
    scheme: &'static str,
    auth: Auth,
}

/// A bearer token from `oci-client`'s token dance, or a user and password
/// for a registry that takes Basic authentication, or nothing.
pub(crate) enum Auth {
    Bearer(String),
    Basic(String, String),
    Anonymous,
}

impl ManifestClient {
    pub(crate) fn new(plain_http: bool, auth: Auth) -> Result<Self> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .read_timeout(Duration::from_secs(120))
            .build()
            .map_err(|e| ImageError::Registry {
                reference: String::new(),
                detail: format!("making an HTTP client: {}", chain(&e)),
            })?;
        let scheme = if plain_http { "http" } else { "https" };
        Ok(Self { http, scheme, auth })
    }

    /// The image manifest of `reference`; from an index, the one that
    /// `pick` chooses. Returns it with its digest.
    pub(crate) async fn image_manifest(
        &self,
        reference: &Reference,
        limits: &ImageLimits,
        pick: impl Fn(&[oci_client::manifest::ImageIndexEntry]) -> Option<String>,
    ) -> Result<(OciImageManifest, String)> {
        let (manifest, digest) = self.manifest(reference, limits).await?;
        let index = match manifest {
            OciManifest::Image(m) => return Ok((m, digest)),
            OciManifest::ImageIndex(index) => index,
        };
        let whole = reference.whole();
        let chosen = pick(&index.manifests).ok_or(ImageError::NoPlatform {
            reference: whole.clone(),
        })?;
        let platform = reference.clone_with_digest(chosen);
        match self.manifest(&platform, limits).await? {
            (OciManifest::Image(m), digest) => Ok((m, digest)),
            (OciManifest::ImageIndex(_), _) => Err(ImageError::Unsupported {
                reference: whole,
                detail: "its index points to another index, not to an image".into(),
            }),
        }
    }

    /// One manifest or index, parsed, with the digest of its bytes (checked
    /// against the reference's digest and the registry's
    /// `Docker-Content-Digest` where they are given).
    async fn manifest(
        &self,
        reference: &Reference,
        limits: &ImageLimits,
    ) -> Result<(OciManifest, String)> {
        let whole = reference.whole();
        let mut response = self.get(reference).await?;
        let status = response.status();
        if !status.is_success() {
            let body = read_capped(&mut response, ERROR_BODY_MAX, &whole)
                .await?
                .unwrap_or_default();
            return Err(refusal(&whole, status.as_u16(), &body));
        }
        let header_digest = response
            .headers()
            .get("docker-content-digest")
            .and_then(|v| v.to_str().ok())
            .map(str::to_ascii_lowercase);
        let body = read_capped(&mut response, limits.max_manifest_bytes, &whole)
            .await?
            .ok_or_else(|| ImageError::TooLarge {
                subject: format!("image `{whole}`"),
                detail: format!(
                    "its manifest is over the limit of {} on manifests and configs",
                    size_text(limits.max_manifest_bytes)
                ),
            })?;
        let digest = format!("sha256:{}", hex::encode(Sha256::digest(&body)));
        for claimed in [
            reference.digest().map(str::to_ascii_lowercase),
            header_digest,
        ]
        .into_iter()
        .flatten()
        .filter(|d| d.starts_with("sha256:"))
        {
            if claimed != digest {
                return Err(ImageError::DigestMismatch {
                    digest: claimed,
                    actual: digest.trim_start_matches("sha256:").to_string(),
                });
            }
        }
        let manifest = parse(&body).map_err(|detail| ImageError::Unsupported {
            reference: whole,
            detail,
        })?;
        Ok((manifest, digest))
    }

    async fn get(&self, reference: &Reference) -> Result<reqwest::Response> {
        let request = self.http.get(self.url(reference)).header(
            reqwest::header::ACCEPT,
            [
                OCI_IMAGE_MEDIA_TYPE,
                IMAGE_MANIFEST_MEDIA_TYPE,
                OCI_IMAGE_INDEX_MEDIA_TYPE,
                IMAGE_MANIFEST_LIST_MEDIA_TYPE,
            ]
            .join(", "),
        );
        let request = match &self.auth {
            Auth::Bearer(token) => request.bearer_auth(token),
            Auth::Basic(user, password) => request.basic_auth(user, Some(password)),
            Auth::Anonymous => request,
        };
        request.send().await.map_err(|e| unreachable(reference, &e))
    }

    /// The manifest URL, as `oci-client` builds it (Docker Hub's
    /// `docker.io` is `index.docker.io`; `ns` for a mirror).
    fn url(&self, reference: &Reference) -> String {
        let tag = reference.digest().or(reference.tag()).unwrap_or("latest");
        let ns = reference
            .namespace()
            .map(|ns| format!("?ns={ns}"))
            .unwrap_or_default();
        format!(
            "{}://{}/v2/{}/manifests/{tag}{ns}",
            self.scheme,
            reference.resolve_registry(),
            reference.repository()
        )
    }
}

/// The body, or `None` when it is longer than `cap` (read no further).
async fn read_capped(
    response: &mut reqwest::Response,
    cap: u64,
    whole: &str,
) -> Result<Option<Vec<u8>>> {
    if response.content_length().is_some_and(|n| n > cap) {
        return Ok(None);
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| ImageError::Registry {
        reference: whole.to_string(),
        detail: format!("reading the manifest: {}", chain(&e)),
    })? {
        if body.len() as u64 + chunk.len() as u64 > cap {
            return Ok(None);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Some(body))
}

/// A manifest or index of schema 2, or why not.
fn parse(body: &[u8]) -> std::result::Result<OciManifest, String> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Versioned {
        schema_version: u8,
    }
    let v: Versioned =
        serde_json::from_slice(body).map_err(|e| format!("its manifest is not a manifest: {e}"))?;
    if v.schema_version != 2 {
        return Err(format!(
            "its manifest has schema version {}; only OCI and Docker v2 manifests are supported",
            v.schema_version
        ));
    }
    serde_json::from_slice(body).map_err(|e| format!("its manifest is not a manifest: {e}"))
}

/// An error status, as the registry's error codes (or the status) say.
fn refusal(whole: &str, status: u16, body: &[u8]) -> ImageError {
    let reference = whole.to_string();
    let codes: Vec<String> = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["errors"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .filter_map(|e| e["code"].as_str().map(str::to_string))
        .collect();
    let has = |names: &[&str]| codes.iter().any(|c| names.contains(&c.as_str()));
    let detail = format!(
        "the registry answered {status}{}",
        if codes.is_empty() {
            String::new()
        } else {
            format!(" ({})", codes.join(", "))
        }
    );
    if has(&["MANIFEST_UNKNOWN", "NAME_UNKNOWN", "NOT_FOUND"]) || status == 404 {
        ImageError::NotFound { reference }
    } else if has(&["UNAUTHORIZED", "DENIED"]) || status == 401 || status == 403 {
        ImageError::AuthFailed { reference, detail }
    } else {
        ImageError::Registry { reference, detail }
    }
}

fn unreachable(reference: &Reference, e: &reqwest::Error) -> ImageError {
    let reference = reference.whole();
    if e.is_connect() || e.is_timeout() {
        ImageError::Unreachable {
            reference,
            detail: chain(e),
        }
    } else {
        ImageError::Registry {
            reference,
            detail: chain(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_refusals_say_what_they_mean() {
        let unknown = br#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"x"}]}"#;
        assert!(matches!(
            refusal("r", 404, unknown),
            ImageError::NotFound { .. }
        ));
        let denied = br#"{"errors":[{"code":"DENIED"}]}"#;
        assert!(matches!(
            refusal("r", 403, denied),
            ImageError::AuthFailed { .. }
        ));
        assert!(matches!(
            refusal("r", 401, b""),
            ImageError::AuthFailed { .. }
        ));
        let e = refusal("r", 500, b"oops").to_string();
        assert!(e.contains("answered 500"), "{e}");
    }

    #[test]
    fn schema_1_manifests_are_refused() {
        let e = parse(br#"{"schemaVersion":1,"fsLayers":[]}"#).unwrap_err();
        assert!(e.contains("schema version 1"), "{e}");
        assert!(parse(b"not json").is_err());
    }

    #[test]
    fn urls_are_the_registrys_own() {
        let c = ManifestClient::new(true, Auth::Anonymous).unwrap();
        let r: Reference = "127.0.0.1:5000/team/app:1".parse().unwrap();
        assert_eq!(c.url(&r), "http://127.0.0.1:5000/v2/team/app/manifests/1");
        let hub: Reference = "debian".parse().unwrap();
        let c = ManifestClient::new(false, Auth::Anonymous).unwrap();
        assert_eq!(
            c.url(&hub),
            "https://index.docker.io/v2/library/debian/manifests/latest"
        );
    }
}
