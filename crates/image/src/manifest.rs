//! Reading an image's manifest from a registry with a size cap.
//!
//! A manifest response is streamed and refused past
//! [`ImageLimits::max_manifest_bytes`]: a hostile registry could send one
//! without end. The manifest (and, for a multi-arch image, its index) is
//! fetched with the pull's [`RegistryClient`], its credentials and checks.

use oci_client::manifest::{
    OciImageManifest, OciManifest, IMAGE_MANIFEST_LIST_MEDIA_TYPE, IMAGE_MANIFEST_MEDIA_TYPE,
    OCI_IMAGE_INDEX_MEDIA_TYPE, OCI_IMAGE_MEDIA_TYPE,
};
use oci_client::Reference;
use sha2::{Digest, Sha256};

use crate::client::{read_capped, read_small, RegistryClient};
use crate::error::{ImageError, Result};
use crate::limits::{size_text, ImageLimits};

impl RegistryClient {
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
        let mut response = self.get_manifest(reference).await?;
        let status = response.status();
        if !status.is_success() {
            let body = read_small(&mut response, &whole).await?.unwrap_or_default();
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

    async fn get_manifest(&self, reference: &Reference) -> Result<reqwest::Response> {
        let accept = [
            OCI_IMAGE_MEDIA_TYPE,
            IMAGE_MANIFEST_MEDIA_TYPE,
            OCI_IMAGE_INDEX_MEDIA_TYPE,
            IMAGE_MANIFEST_LIST_MEDIA_TYPE,
        ]
        .join(", ");
        self.get(reference, &self.manifest_url(reference), Some(&accept))
            .await
    }

    /// The manifest URL, as `oci-client` builds it (`ns` for a mirror).
    pub(crate) fn manifest_url(&self, reference: &Reference) -> String {
        let tag = reference.digest().or(reference.tag()).unwrap_or("latest");
        let ns = reference
            .namespace()
            .map(|ns| format!("?ns={ns}"))
            .unwrap_or_default();
        format!(
            "{}/v2/{}/manifests/{tag}{ns}",
            self.base(reference),
            reference.repository()
        )
    }
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
pub(crate) fn refusal(whole: &str, status: u16, body: &[u8]) -> ImageError {
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
        let opts = crate::FetchOptions::default();
        let r: Reference = "127.0.0.1:5000/team/app:1".parse().unwrap();
        let c = RegistryClient::new(&r, &opts).unwrap();
        assert_eq!(
            c.manifest_url(&r),
            "http://127.0.0.1:5000/v2/team/app/manifests/1"
        );
        let hub: Reference = "debian".parse().unwrap();
        let c = RegistryClient::new(&hub, &opts).unwrap();
        assert_eq!(
            c.manifest_url(&hub),
            "https://index.docker.io/v2/library/debian/manifests/latest"
        );
    }
}
