//! The node's API key: generated on first start, kept 0600 in
//! `$SIESTA_HOME/secrets/api-key`.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Reads the API key under `home`, creating it (random, `siesta_` + 40 hex
/// digits) if there is none yet.
pub fn load_or_create_api_key(home: &Path) -> std::io::Result<String> {
    let dir = home.join("secrets");
    let path = dir.join("api-key");
    match std::fs::read_to_string(&path) {
        Ok(key) if !key.trim().is_empty() => return Ok(key.trim().to_string()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(with_path(e, &path)),
    }
    std::fs::create_dir_all(&dir).map_err(|e| with_path(e, &dir))?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| with_path(e, &dir))?;
    let mut bytes = [0u8; 20];
    rand::Rng::fill(&mut rand::thread_rng(), &mut bytes[..]);
    let key = format!("siesta_{}", hex::encode(bytes));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| with_path(e, &path))?;
    f.write_all(key.as_bytes())
        .map_err(|e| with_path(e, &path))?;
    f.sync_all().map_err(|e| with_path(e, &path))?;
    Ok(key)
}

fn with_path(e: std::io::Error, path: &Path) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_is_created_once_with_mode_0600() {
        let home = tempfile::tempdir().unwrap();
        let k1 = load_or_create_api_key(home.path()).unwrap();
        let k2 = load_or_create_api_key(home.path()).unwrap();
        assert_eq!(k1, k2);
        let mode = std::fs::metadata(home.path().join("secrets/api-key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
