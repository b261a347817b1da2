//! How a node reaches etcd: endpoints, TLS and credentials.
//!
//! etcd holds who owns which sandbox and where each node is, so a node
//! talks to it over TLS (`https://` endpoints, a CA to check the members
//! by, a client certificate when the members ask for one) and as a user
//! with a password when etcd has auth enabled. Plain `http://` endpoints
//! are refused unless the operator says `--insecure-etcd` (a test network
//! on one host).

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::{Error, Result};

/// Where etcd is and how to prove who this node is to it.
#[derive(Debug, Clone, Default)]
pub struct EtcdConfig {
    /// Client URLs, tried in order.
    pub endpoints: Vec<String>,
    /// PEM CA bundle the members' certificates are checked against
    /// (default: the system's roots).
    pub ca: Option<PathBuf>,
    /// PEM client certificate and its key, for members that ask for one
    /// (`--client-cert-auth`).
    pub client_cert: Option<(PathBuf, PathBuf)>,
    /// etcd user and the file holding its password.
    pub user: Option<(String, PathBuf)>,
    /// Allow `http://` endpoints.
    pub insecure: bool,
}

/// A user name and password, read once at start.
#[derive(Clone)]
pub(crate) struct Credentials {
    pub name: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credentials({}, ..)", self.name)
    }
}

impl EtcdConfig {
    /// Plain-HTTP endpoints with no credentials (tests on one host).
    pub fn insecure(endpoints: Vec<String>) -> Self {
        Self {
            endpoints,
            insecure: true,
            ..Self::default()
        }
    }

    /// The endpoints, checked: at least one, each `https://` (or
    /// `http://` when insecure is allowed).
    pub(crate) fn checked_endpoints(&self) -> Result<Vec<String>> {
        if self.endpoints.is_empty() {
            return Err(Error::Config("no etcd endpoint given".into()));
        }
        let mut out = Vec::new();
        for e in &self.endpoints {
            let e = e.trim().trim_end_matches('/');
            if e.starts_with("http://") && !self.insecure {
                return Err(Error::Config(format!(
                    "etcd endpoint {e} is plain HTTP: whoever is on the path reads the cluster's \
                     state and can rewrite it. Use https:// (--etcd-ca, and --etcd-cert/--etcd-key \
                     when etcd asks for client certificates), or pass --insecure-etcd on a \
                     network nobody else reaches"
                )));
            }
            if !e.starts_with("http://") && !e.starts_with("https://") {
                return Err(Error::Config(format!(
                    "etcd endpoint {e:?} must start with https:// (or http:// with --insecure-etcd)"
                )));
            }
            out.push(e.to_string());
        }
        Ok(out)
    }

    /// The user and password, the password read from its file (first
    /// line, trailing newline dropped).
    pub(crate) fn credentials(&self) -> Result<Option<Credentials>> {
        let Some((name, file)) = &self.user else {
            return Ok(None);
        };
        let text = read(file, "etcd password file")?;
        let text = String::from_utf8(text).map_err(|_| {
            Error::Config(format!(
                "etcd password file {} is not UTF-8",
                file.display()
            ))
        })?;
        let password = text.lines().next().unwrap_or_default().to_string();
        if name.is_empty() || password.is_empty() {
            return Err(Error::Config(format!(
                "etcd user {name:?}: the user name and the password in {} must not be empty",
                file.display()
            )));
        }
        Ok(Some(Credentials {
            name: name.clone(),
            password,
        }))
    }

    /// The HTTP client, with the CA and client certificate set up.
    pub(crate) fn http_client(&self, call_timeout: Duration) -> Result<reqwest::Client> {
        let mut b = reqwest::Client::builder()
            .use_rustls_tls()
            .connect_timeout(Duration::from_secs(1))
            .timeout(call_timeout);
        if let Some(ca) = &self.ca {
            let pem = read(ca, "etcd CA")?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
                Error::Config(format!("etcd CA {}: not a PEM bundle: {e}", ca.display()))
            })?;
            if certs.is_empty() {
                return Err(Error::Config(format!(
                    "etcd CA {}: no certificate in it",
                    ca.display()
                )));
            }
            b = b.tls_built_in_root_certs(false);
            for cert in certs {
                b = b.add_root_certificate(cert);
            }
        }
        if let Some((cert, key)) = &self.client_cert {
            let mut pem = read(cert, "etcd client certificate")?;
            pem.push(b'\n');
            pem.extend(read(key, "etcd client key")?);
            let identity = reqwest::Identity::from_pem(&pem).map_err(|e| {
                Error::Config(format!(
                    "etcd client certificate {} with key {}: {e}",
                    cert.display(),
                    key.display()
                ))
            })?;
            b = b.identity(identity);
        }
        b.build()
            .map_err(|e| Error::Config(format!("HTTP client for etcd: {e}")))
    }
}

fn read(path: &Path, what: &str) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| Error::Config(format!("{what} {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_http_needs_to_be_asked_for() {
        let c = EtcdConfig {
            endpoints: vec!["http://10.0.0.1:2379".into()],
            ..EtcdConfig::default()
        };
        let err = c.checked_endpoints().unwrap_err().to_string();
        assert!(err.contains("--insecure-etcd"), "{err}");
        let c = EtcdConfig::insecure(vec!["http://10.0.0.1:2379/".into()]);
        assert_eq!(c.checked_endpoints().unwrap(), ["http://10.0.0.1:2379"]);
        let c = EtcdConfig {
            endpoints: vec!["https://e1:2379".into(), "https://e2:2379".into()],
            ..EtcdConfig::default()
        };
        assert_eq!(c.checked_endpoints().unwrap().len(), 2);
        let c = EtcdConfig {
            endpoints: vec!["e1:2379".into()],
            ..EtcdConfig::default()
        };
        assert!(c.checked_endpoints().is_err());
        assert!(EtcdConfig::default().checked_endpoints().is_err());
    }

    #[test]
    fn the_password_comes_from_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pw");
        std::fs::write(&file, "s3cret\n").unwrap();
        let c = EtcdConfig {
            user: Some(("siesta".into(), file.clone())),
            ..EtcdConfig::default()
        };
        let got = c.credentials().unwrap().unwrap();
        assert_eq!(
            (got.name.as_str(), got.password.as_str()),
            ("siesta", "s3cret")
        );
        assert!(!format!("{got:?}").contains("s3cret"));
        std::fs::write(&file, "\n").unwrap();
        assert!(c.credentials().is_err());
        let gone = EtcdConfig {
            user: Some(("siesta".into(), dir.path().join("none"))),
            ..EtcdConfig::default()
        };
        assert!(gone.credentials().unwrap_err().to_string().contains("none"));
    }
}
