//! The node's API keys: generated on first start, kept 0600 in
//! `$SIESTA_HOME/secrets/`.
//!
//! A key is `e2b_` and 40 lowercase hex digits, the shape every E2B SDK
//! accepts (SDK 2.45 refuses anything else with "Invalid API key format";
//! later ones check nothing). Nodes set up before minted `siesta_…` keys:
//! on start such a key moves to `api-key.previous`, which is still
//! accepted, and `api-key` gets a new key of the E2B shape.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

const KEY_FILE: &str = "api-key";
const PREVIOUS_FILE: &str = "api-key.previous";

/// The key to hand out, and every key the API accepts.
#[derive(Debug, Clone)]
pub struct ApiKeys {
    current: String,
    accepted: Arc<Vec<String>>,
    /// `current` was made by this load: nobody has seen it yet.
    minted: bool,
}

impl ApiKeys {
    /// One key, accepted alone (tests, embedders).
    pub fn single(key: impl Into<String>) -> Self {
        let key = key.into();
        Self {
            accepted: Arc::new(vec![key.clone()]),
            current: key,
            minted: false,
        }
    }

    /// The key clients should use (in [`key_file`]).
    pub fn current(&self) -> &str {
        &self.current
    }

    /// True when the current key was minted by the load that made this:
    /// the only time `siesta serve` shows it (and only on a terminal).
    pub fn minted(&self) -> bool {
        self.minted
    }

    /// Whether `given` is one of the node's keys (in constant time for
    /// each key, so a guess learns nothing from timing).
    pub fn accepts(&self, given: &str) -> bool {
        self.accepted.iter().fold(false, |hit, key| {
            siesta_envd_proto::secrets_match(given.as_bytes(), key.as_bytes()) | hit
        })
    }
}

/// The 401 for a request whose `X-API-Key` is missing or not one of
/// `keys`; `None` when it is one.
pub(crate) fn refusal(
    keys: &ApiKeys,
    headers: &axum::http::HeaderMap,
) -> Option<crate::error::ApiError> {
    let given = headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if keys.accepts(given) {
        return None;
    }
    let msg = if given.is_empty() {
        "missing X-API-KEY header (the node's key is in $SIESTA_HOME/secrets/api-key)"
    } else {
        "invalid API key"
    };
    Some(crate::error::ApiError::new(
        axum::http::StatusCode::UNAUTHORIZED,
        msg,
    ))
}

/// True for a key of the shape the E2B SDKs accept: `e2b_` and hex digits.
pub fn is_e2b_shaped(key: &str) -> bool {
    key.strip_prefix("e2b_").is_some_and(|hex| {
        !hex.is_empty()
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// Where the current key of the node at `home` is kept.
pub fn key_file(home: &Path) -> PathBuf {
    home.join("secrets").join(KEY_FILE)
}

/// Reads the node's keys under `home`, minting one when there is none and
/// replacing a key of the old `siesta_` shape (which stays accepted).
pub fn load_or_create_api_keys(home: &Path) -> std::io::Result<ApiKeys> {
    let dir = home.join("secrets");
    let path = dir.join(KEY_FILE);
    let previous_path = dir.join(PREVIOUS_FILE);
    // Every start, not only when a key is minted: a directory someone
    // opened up since is closed again.
    ensure_dir(&dir)?;
    let mut previous = read_keys(&previous_path)?;
    let mut minted = false;
    let current = match read_keys(&path)?.into_iter().next() {
        Some(key) if is_e2b_shaped(&key) => key,
        old => {
            if let Some(old) = old {
                // Keep the old key first, then replace it: a crash between
                // the two leaves both on disk, never neither.
                if !previous.contains(&old) {
                    previous.push(old);
                    write_secret(&previous_path, &previous.join("\n"))?;
                }
            }
            let key = mint();
            write_secret(&path, &key)?;
            minted = true;
            key
        }
    };
    let mut accepted = vec![current.clone()];
    accepted.extend(previous.into_iter().filter(|k| *k != current));
    Ok(ApiKeys {
        current,
        accepted: Arc::new(accepted),
        minted,
    })
}

fn mint() -> String {
    let mut bytes = [0u8; 20];
    rand::Rng::fill(&mut rand::thread_rng(), &mut bytes[..]);
    format!("e2b_{}", hex::encode(bytes))
}

/// Non-empty lines of `path`; none when it does not exist.
fn read_keys(path: &Path) -> std::io::Result<Vec<String>> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(String::from)
            .collect()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(with_path(e, path)),
    }
}

fn ensure_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| with_path(e, dir))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| with_path(e, dir))
}

/// Writes `text` to `path` (mode 0600) through a temporary file and a
/// rename, so a reader sees the old content or the new, never a torn one.
/// The temporary file is always a new one: a file (or link) left at its
/// name would keep its own mode and owner, and the key would take them.
fn write_secret(path: &Path, text: &str) -> std::io::Result<()> {
    let tmp = PathBuf::from(format!("{}.tmp", path.display()));
    match std::fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(with_path(e, &tmp)),
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| with_path(e, &tmp))?;
    f.write_all(text.as_bytes())
        .map_err(|e| with_path(e, &tmp))?;
    f.sync_all().map_err(|e| with_path(e, &tmp))?;
    std::fs::rename(&tmp, path).map_err(|e| with_path(e, path))?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| with_path(e, dir))?;
    }
    Ok(())
}

fn with_path(e: std::io::Error, path: &Path) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_is_created_once_with_mode_0600_in_the_e2b_shape() {
        let home = tempfile::tempdir().unwrap();
        let first = load_or_create_api_keys(home.path()).unwrap();
        let again = load_or_create_api_keys(home.path()).unwrap();
        assert!(first.minted() && !again.minted());
        let (k1, k2) = (first.current, again.current);
        assert_eq!(k1, k2);
        assert!(is_e2b_shaped(&k1), "{k1}");
        assert_eq!(k1.len(), 4 + 40);
        let mode = std::fs::metadata(key_file(home.path()))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn an_old_siesta_key_is_replaced_and_still_accepted() {
        let home = tempfile::tempdir().unwrap();
        let secrets = home.path().join("secrets");
        std::fs::create_dir_all(&secrets).unwrap();
        let old = format!("siesta_{}", "ab".repeat(20));
        std::fs::write(secrets.join("api-key"), format!("{old}\n")).unwrap();
        let keys = load_or_create_api_keys(home.path()).unwrap();
        assert!(is_e2b_shaped(keys.current()));
        assert!(keys.accepts(keys.current()));
        assert!(keys.accepts(&old));
        assert!(!keys.accepts("e2b_00"));
        assert!(!keys.accepts(""));
        // Stable from then on: the same new key, the old one still good.
        let again = load_or_create_api_keys(home.path()).unwrap();
        assert_eq!(again.current(), keys.current());
        assert!(again.accepts(&old));
    }

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    /// A temporary file left world-readable (by a crash, or by someone
    /// who can write there) must not lend its mode to the new key.
    #[test]
    fn a_leftover_temporary_file_does_not_open_the_key() {
        let home = tempfile::tempdir().unwrap();
        let secrets = home.path().join("secrets");
        std::fs::create_dir_all(&secrets).unwrap();
        // An old-shape key makes the load mint a new one.
        std::fs::write(secrets.join("api-key"), "siesta_00\n").unwrap();
        let tmp = secrets.join("api-key.tmp");
        std::fs::write(&tmp, "left over").unwrap();
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o666)).unwrap();
        let keys = load_or_create_api_keys(home.path()).unwrap();
        assert!(keys.minted());
        assert_eq!(mode(&key_file(home.path())), 0o600);
        assert_eq!(mode(&secrets.join("api-key.previous")), 0o600);
        assert!(!tmp.exists());
    }

    #[test]
    fn the_secrets_directory_is_closed_on_every_load() {
        let home = tempfile::tempdir().unwrap();
        load_or_create_api_keys(home.path()).unwrap();
        let secrets = home.path().join("secrets");
        std::fs::set_permissions(&secrets, std::fs::Permissions::from_mode(0o755)).unwrap();
        let keys = load_or_create_api_keys(home.path()).unwrap();
        assert!(!keys.minted());
        assert_eq!(mode(&secrets), 0o700);
    }

    #[test]
    fn the_e2b_shape_is_the_sdks() {
        assert!(is_e2b_shaped(&format!("e2b_{}", "0".repeat(40))));
        assert!(is_e2b_shaped("e2b_0a"));
        assert!(!is_e2b_shaped("e2b_"));
        assert!(!is_e2b_shaped("e2b_ZZ"));
        assert!(!is_e2b_shaped("e2b_AB"));
        assert!(!is_e2b_shaped("siesta_00"));
    }
}
