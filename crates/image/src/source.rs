//! Where an image comes from: a registry reference, a local OCI layout, or
//! a docker-archive tarball, named as skopeo names them.

use std::fmt;
use std::path::PathBuf;

use oci_client::Reference;

use crate::error::{ImageError, Result};

/// An image to fetch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageSource {
    /// `debian:12`, `docker.io/library/python:3.12`, `127.0.0.1:5000/a/b:t`,
    /// `name@sha256:...`, optionally written `docker://...`. Names without a
    /// registry are Docker Hub's, as Docker resolves them.
    Registry(Reference),
    /// `oci:DIR[:TAG]`: an OCI image layout directory (`index.json`,
    /// `blobs/`). Without a tag the layout must hold exactly one image.
    OciLayout { dir: PathBuf, tag: Option<String> },
    /// `docker-archive:FILE`: a tarball as `docker save` or `skopeo copy ...
    /// docker-archive:` writes it (`manifest.json` and layer tars).
    DockerArchive { path: PathBuf },
}

impl ImageSource {
    /// Parses `text` as one of the forms above.
    pub fn parse(text: &str) -> Result<Self> {
        let text = text.trim();
        let invalid = |reason: &str| ImageError::InvalidReference {
            reference: text.to_string(),
            reason: reason.to_string(),
        };
        if let Some(rest) = text.strip_prefix("oci:") {
            let (dir, tag) = split_layout_tag(rest);
            if dir.is_empty() {
                return Err(invalid(
                    "`oci:` needs a directory, as in oci:/path/to/layout:tag",
                ));
            }
            return Ok(ImageSource::OciLayout {
                dir: PathBuf::from(dir),
                tag: tag.map(str::to_string),
            });
        }
        if let Some(path) = text.strip_prefix("docker-archive:") {
            // skopeo allows `docker-archive:FILE:REF`; the reference only
            // picks among several images, which we do not support.
            let path = path.split(':').next().unwrap_or("");
            if path.is_empty() {
                return Err(invalid(
                    "`docker-archive:` needs a file, as in docker-archive:/tmp/image.tar",
                ));
            }
            return Ok(ImageSource::DockerArchive {
                path: PathBuf::from(path),
            });
        }
        let name = text.strip_prefix("docker://").unwrap_or(text);
        if name.is_empty() {
            return Err(invalid("empty image name"));
        }
        let reference: Reference = name.parse().map_err(|e| invalid(&format!("{e}")))?;
        Ok(ImageSource::Registry(reference))
    }

    /// The host (and port) of a registry source.
    pub fn registry(&self) -> Option<&str> {
        match self {
            ImageSource::Registry(r) => Some(r.registry()),
            _ => None,
        }
    }

    /// Whether `reach` lets a pull of this source connect to its registry:
    /// the registry's host is resolved and every address it has is checked
    /// (see [`crate::Reach::check_host`]), so that a refusal comes before
    /// the build starts. The pull checks again as it connects: this is a
    /// clear early answer, not the guard itself. Local sources pass.
    pub async fn check_reach(&self, reach: &crate::Reach) -> Result<()> {
        let ImageSource::Registry(reference) = self else {
            return Ok(());
        };
        let registry = reference.resolve_registry();
        let host = registry_host(registry);
        let port = registry_port(registry).unwrap_or(443);
        reach
            .check_host(host, port)
            .await
            .map_err(|refused| ImageError::Forbidden {
                reference: reference.whole(),
                refused,
            })
    }
}

/// `DIR:TAG` where TAG is the part after the last `:` when it holds no `/`
/// (so `oci:/a:b/c` is a directory with no tag).
fn split_layout_tag(rest: &str) -> (&str, Option<&str>) {
    match rest.rsplit_once(':') {
        Some((dir, tag)) if !tag.contains('/') && !tag.is_empty() => (dir, Some(tag)),
        _ => (rest, None),
    }
}

impl fmt::Display for ImageSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ImageSource::Registry(r) => write!(f, "{}", r.whole()),
            ImageSource::OciLayout { dir, tag: Some(t) } => write!(f, "oci:{}:{t}", dir.display()),
            ImageSource::OciLayout { dir, tag: None } => write!(f, "oci:{}", dir.display()),
            ImageSource::DockerArchive { path } => write!(f, "docker-archive:{}", path.display()),
        }
    }
}

/// A registry user and password (or token as password).
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// How to reach registries.
#[derive(Debug, Clone, Default)]
pub struct FetchOptions {
    /// Credentials for the image's registry; anonymous without.
    pub credentials: Option<Credentials>,
    /// Registries (`host` or `host:port`) spoken to over plain HTTP.
    /// Loopback registries (`localhost`, `127.0.0.0/8`, `[::1]`) always are,
    /// as Docker treats them (a pull whose [`crate::Reach`] is public
    /// reaches them only once the operator opened loopback).
    pub insecure_registries: Vec<String>,
    /// Caps on what a pull downloads and what unpacking writes.
    pub limits: crate::ImageLimits,
    /// Where the pull may connect: anywhere (the default, for the
    /// operator's own builds) or public addresses only (builds asked for
    /// through the API).
    pub reach: crate::Reach,
}

impl FetchOptions {
    /// Whether `registry` (`host[:port]`) is spoken to over plain HTTP.
    pub fn plain_http(&self, registry: &str) -> bool {
        let host = registry_host(registry);
        if host == "localhost" || host == "::1" || host.starts_with("127.") {
            return true;
        }
        self.insecure_registries
            .iter()
            .any(|r| r == registry || r == host)
    }
}

/// The port of `host:port` or `[v6]:port`, if it names one.
fn registry_port(registry: &str) -> Option<u16> {
    let rest = match registry.strip_prefix('[') {
        Some(v6) => v6.split_once(']')?.1,
        None => registry,
    };
    rest.rsplit_once(':')?.1.parse().ok()
}

/// The host part of `host[:port]` or `[v6]:port`.
fn registry_host(registry: &str) -> &str {
    if let Some(rest) = registry.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    registry.split(':').next().unwrap_or(registry)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_names_are_docker_hub_library_images() {
        let ImageSource::Registry(r) = ImageSource::parse("debian:12").unwrap() else {
            panic!("not a registry source")
        };
        assert_eq!(r.registry(), "docker.io");
        assert_eq!(r.repository(), "library/debian");
        assert_eq!(r.tag(), Some("12"));
    }

    #[test]
    fn local_registries_keep_their_port() {
        let s = ImageSource::parse("docker://127.0.0.1:5000/team/py:3").unwrap();
        assert_eq!(s.registry(), Some("127.0.0.1:5000"));
        assert!(FetchOptions::default().plain_http("127.0.0.1:5000"));
        assert!(FetchOptions::default().plain_http("localhost:5000"));
        assert!(!FetchOptions::default().plain_http("registry.example.com"));
        let opts = FetchOptions {
            insecure_registries: vec!["registry.lan:5000".into()],
            ..Default::default()
        };
        assert!(opts.plain_http("registry.lan:5000"));
        assert_eq!(registry_port("127.0.0.1:5000"), Some(5000));
        assert_eq!(registry_port("[::1]:5000"), Some(5000));
        assert_eq!(registry_port("[::1]"), None);
        assert_eq!(registry_port("index.docker.io"), None);
        assert_eq!(registry_host("[::1]:5000"), "::1");
    }

    #[tokio::test]
    async fn registries_are_checked_before_a_build_by_every_address() {
        let public = crate::Reach::public(vec![]).unwrap();
        for closed in [
            "127.0.0.1:2379/v3/kv:x",
            "localhost:5000/a/b:c",
            "10.0.0.1/a:b",
            "169.254.169.254/latest:x",
        ] {
            let e = ImageSource::parse(closed)
                .unwrap()
                .check_reach(&public)
                .await
                .unwrap_err();
            assert!(matches!(e, ImageError::Forbidden { .. }), "{closed}: {e}");
        }
        let local = ImageSource::parse("oci:/tmp/layout").unwrap();
        assert!(local.check_reach(&public).await.is_ok());
        let loopback = ImageSource::parse("127.0.0.1:5000/a/b:c").unwrap();
        assert!(loopback.check_reach(&crate::Reach::Anywhere).await.is_ok());
        let opened = crate::Reach::public(vec!["127.0.0.0/8".parse().unwrap()]).unwrap();
        assert!(loopback.check_reach(&opened).await.is_ok());
    }

    #[test]
    fn layouts_and_archives() {
        assert_eq!(
            ImageSource::parse("oci:/tmp/layout:v1").unwrap(),
            ImageSource::OciLayout {
                dir: "/tmp/layout".into(),
                tag: Some("v1".into())
            }
        );
        assert_eq!(
            ImageSource::parse("oci:/tmp/lay:out/x").unwrap(),
            ImageSource::OciLayout {
                dir: "/tmp/lay:out/x".into(),
                tag: None
            }
        );
        assert_eq!(
            ImageSource::parse("docker-archive:/tmp/a.tar").unwrap(),
            ImageSource::DockerArchive {
                path: "/tmp/a.tar".into()
            }
        );
    }

    #[test]
    fn bad_references_say_why() {
        for bad in ["", "oci:", "docker-archive:", "UPPER/Case:x", "a b"] {
            let e = ImageSource::parse(bad).unwrap_err().to_string();
            assert!(e.contains("invalid image reference"), "{bad}: {e}");
        }
    }
}
