//! envd protocol messages shared by the guest agent and the host.
//!
//! The `.proto` files under `proto/` carry the same package, message and field
//! names and numbers as the descriptors in the official E2B SDK, so both the
//! binary protobuf codec (prost) and the proto3 JSON mapping (pbjson, the
//! codec the Python SDK speaks) are wire-compatible with it.

pub mod envelope;

/// `process.Process`: start, attach to and signal processes in the guest.
pub mod process {
    // Generated code: oneofs mixing empty and large messages (e.g. `start{}`
    // and an EntryInfo event); boxing them would change the prost API.
    #![allow(clippy::large_enum_variant)]
    include!(concat!(env!("OUT_DIR"), "/process.rs"));
    include!(concat!(env!("OUT_DIR"), "/process.serde.rs"));
}

/// `filesystem.Filesystem`: stat, list, move, remove and watch paths.
pub mod filesystem {
    // Generated code: oneofs mixing empty and large messages (e.g. `start{}`
    // and an EntryInfo event); boxing them would change the prost API.
    #![allow(clippy::large_enum_variant)]
    include!(concat!(env!("OUT_DIR"), "/filesystem.rs"));
    include!(concat!(env!("OUT_DIR"), "/filesystem.serde.rs"));
}

/// The envd version the agent reports; the SDK gates features on it (>= 0.6.4
/// enables all of them).
pub const ENVD_VERSION: &str = "0.6.4";

/// The TCP port envd listens on inside every guest.
pub const ENVD_PORT: u16 = 49983;

/// Whether two secrets (access tokens, API keys, URL signatures) are
/// equal, in time that does not depend on where they differ, only on their
/// lengths (which are not secret). The one comparison the agent and the
/// server both use.
pub fn secrets_match(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    a.ct_eq(b).into()
}

/// The signature of a signed `/files` URL (`download_url`/`upload_url` of a
/// secure sandbox, `e2b/sandbox/signature.py`): `v1_` + unpadded base64 of
/// SHA-256 over `{path}:{operation}:{user}:{token}[:{expiration}]`, where
/// `operation` is `read` or `write` and `user` is empty for the default.
pub fn file_signature(
    path: &str,
    operation: &str,
    user: &str,
    token: &str,
    expiration: Option<i64>,
) -> String {
    use base64::Engine;
    use sha2::{Digest, Sha256};
    let mut text = format!("{path}:{operation}:{user}:{token}");
    if let Some(exp) = expiration {
        text.push_str(&format!(":{exp}"));
    }
    let digest = Sha256::digest(text.as_bytes());
    format!(
        "v1_{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest)
    )
}

/// A volume the agent mounts at `/init` (a siesta extension of envd's
/// `/init` body, field `siestaMounts`): an NFSv3 export that serves both
/// NFS and MOUNT on `port` at `addr`, mounted at `path`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NfsMount {
    /// Absolute path in the guest.
    pub path: String,
    /// The server's IPv4 address, as the guest reaches it.
    pub addr: String,
    pub port: u16,
}

#[cfg(test)]
mod tests {
    use super::secrets_match;

    #[test]
    fn secrets_match_exactly() {
        assert!(secrets_match(b"secret", b"secret"));
        assert!(!secrets_match(b"secret", b"secreT"));
        assert!(!secrets_match(b"secret", b"secret2"));
        assert!(!secrets_match(b"", b"x"));
        assert!(secrets_match(b"", b""));
    }
}
