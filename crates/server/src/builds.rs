//! Template builds started through the E2B template API: their status and
//! log lines while they run, and the signed upload links for the files of
//! their COPY steps.
//!
//! Build status lives in memory: a build is a few minutes of one server's
//! life. After a restart its status is unknown (404) and the template is
//! either published or absent, never half-built (publishing is atomic).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use serde::Serialize;
use sha2::Sha256;

/// How long an upload link stays valid (the SDK uploads right away; E2B's
/// own links last an hour).
pub const UPLOAD_LINK_TTL: Duration = Duration::from_secs(3600);

/// At most this many log entries in one status page (E2B's limit).
pub const MAX_LOG_PAGE: usize = 100;

/// Builds remembered at most: past it the oldest finished ones are
/// forgotten (their status then answers 404, as after a restart). Builds
/// in progress are never forgotten.
pub const MAX_KEPT_BUILDS: usize = 256;

/// Log entries kept per build; the last one kept says that more were cut.
/// A build's log is its steps' output, which a guest writes.
pub const MAX_LOG_ENTRIES: usize = 10_000;

/// Bytes kept of one log message.
pub const MAX_LOG_MESSAGE: usize = 16 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BuildStatus {
    /// Created, steps not yet posted.
    Waiting,
    Building,
    Ready,
    Error,
}

#[derive(Debug, Clone, Serialize)]
pub struct LogEntry {
    pub timestamp: DateTime<Utc>,
    pub level: &'static str,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct FailureReason {
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
}

/// One build: its template, size and where it is.
#[derive(Debug, Clone)]
pub struct Build {
    pub template: String,
    pub vcpus: Option<u32>,
    pub memory_mib: Option<u32>,
    /// E2B's `minFreeDiskMb`: free space the template's disk keeps.
    pub min_free_disk_mib: Option<u32>,
    /// Tags the template gets when the build is ready.
    pub tags: Vec<String>,
    pub status: BuildStatus,
    pub entries: Vec<LogEntry>,
    pub reason: Option<FailureReason>,
    pub created_at: DateTime<Utc>,
}

/// Every build this server started, by build id.
pub struct Builds {
    builds: Mutex<HashMap<String, Build>>,
    files: PathBuf,
    secret: [u8; 32],
}

impl Builds {
    /// Builds whose uploads are stored under `files`; the link-signing key
    /// is random per process (links are short-lived and used at once).
    pub fn new(files: PathBuf) -> Self {
        let mut secret = [0u8; 32];
        rand::Rng::fill(&mut rand::thread_rng(), &mut secret[..]);
        Self {
            builds: Mutex::new(HashMap::new()),
            files,
            secret,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Build>> {
        // A panic while holding the lock leaves plain data: keep using it.
        self.builds.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a new build of `template` (status `waiting`); its id.
    pub fn create(
        &self,
        template: &str,
        vcpus: Option<u32>,
        memory_mib: Option<u32>,
        min_free_disk_mib: Option<u32>,
        tags: Vec<String>,
    ) -> String {
        let id = new_build_id();
        self.lock().insert(
            id.clone(),
            Build {
                template: template.to_string(),
                vcpus,
                memory_mib,
                min_free_disk_mib,
                tags,
                status: BuildStatus::Waiting,
                entries: Vec::new(),
                reason: None,
                created_at: Utc::now(),
            },
        );
        forget_oldest_finished(&mut self.lock(), MAX_KEPT_BUILDS);
        id
    }

    pub fn get(&self, id: &str) -> Option<Build> {
        self.lock().get(id).cloned()
    }

    /// True if another build of `template` than `except` is running.
    pub fn is_building(&self, template: &str, except: &str) -> bool {
        self.lock().iter().any(|(id, b)| {
            id != except && b.template == template && b.status == BuildStatus::Building
        })
    }

    /// The builds of `template`, newest first.
    pub fn of_template(&self, template: &str) -> Vec<(String, Build)> {
        let mut out: Vec<_> = self
            .lock()
            .iter()
            .filter(|(_, b)| b.template == template)
            .map(|(id, b)| (id.clone(), b.clone()))
            .collect();
        out.sort_by_key(|b| std::cmp::Reverse(b.1.created_at));
        out
    }

    pub fn set_status(&self, id: &str, status: BuildStatus, reason: Option<FailureReason>) {
        if let Some(b) = self.lock().get_mut(id) {
            b.status = status;
            b.reason = reason;
        }
    }

    /// Adds a log entry to build `id`, within [`MAX_LOG_ENTRIES`] and
    /// [`MAX_LOG_MESSAGE`].
    pub fn log(&self, id: &str, level: &'static str, step: Option<String>, message: &str) {
        let mut builds = self.lock();
        let Some(b) = builds.get_mut(id) else { return };
        let (level, message) = match b.entries.len() {
            n if n + 1 < MAX_LOG_ENTRIES => (level, truncated(message)),
            n if n + 1 == MAX_LOG_ENTRIES => (
                "warn",
                format!("build log cut at {MAX_LOG_ENTRIES} entries: later lines are not kept"),
            ),
            _ => return,
        };
        b.entries.push(LogEntry {
            timestamp: Utc::now(),
            level,
            message,
            step,
        });
    }

    /// Where the archive for files hash `hash` is kept.
    pub fn archive_path(&self, hash: &str) -> Option<PathBuf> {
        is_sha256_hex(hash).then(|| self.files.join(format!("{hash}.tar")))
    }

    pub fn files_dir(&self) -> &Path {
        &self.files
    }

    /// A temporary name for one upload of `hash`, unlike any other's: two
    /// uploads of one hash at once must not write into the same file.
    pub fn upload_part_path(&self, hash: &str) -> Option<PathBuf> {
        is_sha256_hex(hash).then(|| {
            let nonce: u64 = rand::Rng::gen(&mut rand::thread_rng());
            self.files.join(format!(".{hash}.{nonce:016x}.part"))
        })
    }

    /// Puts the complete upload `part` in place as `hash`'s archive, unless
    /// one is there already: the first whole upload of a hash stays, and a
    /// later one (a link used again, a second client) cannot replace what
    /// builds may have used. The link is atomic, so a reader sees the
    /// archive whole or not at all. `part` is removed either way; true when
    /// this upload was kept.
    pub fn keep_upload(&self, part: &Path, hash: &str) -> std::io::Result<bool> {
        let Some(path) = self.archive_path(hash) else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{hash:?} is not a SHA-256"),
            ));
        };
        let kept = match std::fs::hard_link(part, &path) {
            Ok(()) => true,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => false,
            Err(e) => {
                let _ = std::fs::remove_file(part);
                return Err(std::io::Error::new(
                    e.kind(),
                    format!("storing {}: {e}", path.display()),
                ));
            }
        };
        std::fs::remove_file(part).map_err(|e| {
            std::io::Error::new(e.kind(), format!("removing {}: {e}", part.display()))
        })?;
        Ok(kept)
    }

    /// A query string (`expires=…&signature=…`) that authorises one upload
    /// of `hash` until `UPLOAD_LINK_TTL` from now.
    pub fn sign_upload(&self, hash: &str) -> String {
        let expires = unix_now() + UPLOAD_LINK_TTL.as_secs();
        format!(
            "expires={expires}&signature={}",
            self.signature(hash, expires)
        )
    }

    /// Checks an upload link's signature and expiry; the error says which.
    pub fn check_upload(&self, hash: &str, expires: u64, signature: &str) -> Result<(), String> {
        let given = hex::decode(signature).map_err(|_| "the upload link's signature is not hex")?;
        self.mac(hash, expires)
            .verify_slice(&given)
            .map_err(|_| "the upload link's signature is wrong (ask for a new link)".to_string())?;
        if unix_now() > expires {
            return Err("the upload link has expired (ask for a new link)".into());
        }
        Ok(())
    }

    fn mac(&self, hash: &str, expires: u64) -> Hmac<Sha256> {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.secret)
            .expect("HMAC takes keys of any length");
        mac.update(format!("upload:{hash}:{expires}").as_bytes());
        mac
    }

    fn signature(&self, hash: &str, expires: u64) -> String {
        hex::encode(self.mac(hash, expires).finalize().into_bytes())
    }
}

/// Forgets finished builds, oldest first, until at most `keep` are left
/// (or only builds in progress).
fn forget_oldest_finished(builds: &mut HashMap<String, Build>, keep: usize) {
    if builds.len() <= keep {
        return;
    }
    let mut finished: Vec<(DateTime<Utc>, String)> = builds
        .iter()
        .filter(|(_, b)| matches!(b.status, BuildStatus::Ready | BuildStatus::Error))
        .map(|(id, b)| (b.created_at, id.clone()))
        .collect();
    finished.sort();
    let excess = builds.len() - keep;
    for (_, id) in finished.into_iter().take(excess) {
        builds.remove(&id);
    }
}

/// `message`, cut to [`MAX_LOG_MESSAGE`] bytes on a character boundary.
fn truncated(message: &str) -> String {
    if message.len() <= MAX_LOG_MESSAGE {
        return message.to_string();
    }
    let mut end = MAX_LOG_MESSAGE;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{} [cut: {} bytes in all]", &message[..end], message.len())
}

pub fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn new_build_id() -> String {
    let mut bytes = [0u8; 16];
    rand::Rng::fill(&mut rand::thread_rng(), &mut bytes[..]);
    uuid_shaped(bytes)
}

/// 16 bytes written as a UUID (8-4-4-4-12 hex digits), the shape E2B's
/// build ids have and the SDK parses.
pub fn uuid_shaped(bytes: [u8; 16]) -> String {
    let h = hex::encode(bytes);
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

/// Shared by the routes.
pub type SharedBuilds = Arc<Builds>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upload_links_verify_and_refuse_tampering() {
        let b = Builds::new(PathBuf::from("/nonexistent"));
        let hash = "a".repeat(64);
        let q = b.sign_upload(&hash);
        let pairs: HashMap<_, _> = form_urlencoded::parse(q.as_bytes()).into_owned().collect();
        let expires: u64 = pairs["expires"].parse().unwrap();
        let sig = &pairs["signature"];
        assert!(b.check_upload(&hash, expires, sig).is_ok());
        assert!(b.check_upload(&"b".repeat(64), expires, sig).is_err());
        assert!(b.check_upload(&hash, expires + 1, sig).is_err());
        assert!(b.check_upload(&hash, expires, "zz").is_err());
        let other = Builds::new(PathBuf::from("/nonexistent"));
        assert!(other.check_upload(&hash, expires, sig).is_err());
    }

    #[test]
    fn expired_links_are_refused() {
        let b = Builds::new(PathBuf::from("/nonexistent"));
        let hash = "c".repeat(64);
        let past = unix_now() - 10;
        let sig = b.signature(&hash, past);
        let err = b.check_upload(&hash, past, &sig).unwrap_err();
        assert!(err.contains("expired"), "{err}");
    }

    #[test]
    fn archive_paths_only_for_sha256_names() {
        let b = Builds::new(PathBuf::from("/f"));
        assert!(b.archive_path("../../etc/passwd").is_none());
        assert_eq!(
            b.archive_path(&"d".repeat(64)).unwrap(),
            PathBuf::from(format!("/f/{}.tar", "d".repeat(64)))
        );
    }

    /// A link used twice (or two clients at once) must neither mix two
    /// uploads in one file nor replace an archive a build may have used.
    #[test]
    fn the_first_whole_upload_of_a_hash_stays() {
        let dir = tempfile::tempdir().unwrap();
        let b = Builds::new(dir.path().to_path_buf());
        let hash = "e".repeat(64);
        let (one, two) = (
            b.upload_part_path(&hash).unwrap(),
            b.upload_part_path(&hash).unwrap(),
        );
        assert_ne!(one, two, "two uploads share a temporary file");
        assert!(b.upload_part_path("../x").is_none());
        std::fs::write(&one, b"first").unwrap();
        std::fs::write(&two, b"second").unwrap();
        assert!(b.keep_upload(&one, &hash).unwrap());
        assert!(!b.keep_upload(&two, &hash).unwrap());
        let archive = b.archive_path(&hash).unwrap();
        assert_eq!(std::fs::read(archive).unwrap(), b"first");
        assert!(!one.exists() && !two.exists());
    }

    #[test]
    fn old_finished_builds_are_forgotten_and_running_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let builds = Builds::new(dir.path().to_path_buf());
        let running = builds.create("t", None, None, None, Vec::new());
        builds.set_status(&running, BuildStatus::Building, None);
        let mut finished = Vec::new();
        for _ in 0..MAX_KEPT_BUILDS + 10 {
            let id = builds.create("t", None, None, None, Vec::new());
            builds.set_status(&id, BuildStatus::Ready, None);
            finished.push(id);
        }
        assert!(builds.lock().len() <= MAX_KEPT_BUILDS + 1);
        assert!(
            builds.get(&running).is_some(),
            "a running build was forgotten"
        );
        assert!(builds.get(finished.last().unwrap()).is_some());
    }

    #[test]
    fn a_build_log_is_bounded_in_entries_and_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let builds = Builds::new(dir.path().to_path_buf());
        let id = builds.create("t", None, None, None, Vec::new());
        builds.log(&id, "info", None, &"é".repeat(MAX_LOG_MESSAGE));
        for _ in 0..MAX_LOG_ENTRIES + 50 {
            builds.log(&id, "info", None, "a line a guest printed");
        }
        let b = builds.get(&id).unwrap();
        assert_eq!(b.entries.len(), MAX_LOG_ENTRIES);
        assert!(b.entries[0].message.len() < MAX_LOG_MESSAGE + 64);
        assert!(b.entries[0].message.ends_with("bytes in all]"));
        let last = b.entries.last().unwrap();
        assert!(last.message.contains("build log cut"), "{}", last.message);
    }

    #[test]
    fn build_ids_are_uuid_shaped_and_distinct() {
        let (a, b) = (new_build_id(), new_build_id());
        assert_eq!(a.len(), 36);
        assert_ne!(a, b);
    }
}
