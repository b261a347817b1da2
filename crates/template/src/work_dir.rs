//! A template build's scratch directory, `templates/.NAME.building/`, with
//! the process that owns it recorded inside (`owner`: its PID and start
//! time). A server starting after a crash removes the directories (and
//! kills the build VMs) of owners that are gone, and leaves alone those of
//! a build still running, such as a `siesta template build` beside it.
//! Startup-manifest recordings (`run/manifest-*/`) are owned the same way.

use std::path::{Path, PathBuf};

use crate::error::{IoContext, Result};

const OWNER_FILE: &str = "owner";
const SUFFIX: &str = ".building";

/// Makes (afresh) the build directory of template `name` under
/// `templates`, owned by this process.
pub(crate) fn create(templates: &Path, name: &str) -> Result<PathBuf> {
    let work = templates.join(format!(".{name}{SUFFIX}"));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).ctx("creating template build directory", &work)?;
    claim(&work)?;
    Ok(work)
}

/// Records this process as the owner of scratch directory `dir`.
pub(crate) fn claim(dir: &Path) -> Result<()> {
    let owner = dir.join(OWNER_FILE);
    let me = process_identity(std::process::id()).unwrap_or_default();
    std::fs::write(&owner, me).ctx("recording a scratch directory's owner", &owner)
}

/// Build directories under `templates` whose owner no longer runs (or
/// that name none: a crash before it was written).
pub fn abandoned(templates: &Path) -> Vec<PathBuf> {
    abandoned_where(templates, |n| n.starts_with('.') && n.ends_with(SUFFIX))
}

/// Directories under `parent` whose name starts with `prefix` and whose
/// owner no longer runs (or that name none).
pub fn abandoned_with_prefix(parent: &Path, prefix: &str) -> Vec<PathBuf> {
    abandoned_where(parent, |n| n.starts_with(prefix))
}

fn abandoned_where(parent: &Path, name_matches: impl Fn(&str) -> bool) -> Vec<PathBuf> {
    let Ok(dir) = std::fs::read_dir(parent) else {
        return Vec::new();
    };
    dir.flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(&name_matches)
        })
        .filter(|p| !owner_runs(p))
        .collect()
}

fn owner_runs(work: &Path) -> bool {
    let Ok(recorded) = std::fs::read_to_string(work.join(OWNER_FILE)) else {
        return false;
    };
    let Some(pid) = recorded
        .split_whitespace()
        .next()
        .and_then(|p| p.parse().ok())
    else {
        return false;
    };
    process_identity(pid).is_some_and(|now| now == recorded)
}

/// `"PID STARTTIME"` of a live process: the start time tells a reused PID
/// apart.
fn process_identity(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name; starttime is field 22,
    // the 20th after it.
    let (_, rest) = stat.rsplit_once(')')?;
    let start = rest.split_whitespace().nth(19)?;
    Some(format!("{pid} {start}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_builds_of_gone_owners_are_abandoned() {
        let dir = tempfile::tempdir().unwrap();
        let mine = create(dir.path(), "live").unwrap();
        assert!(mine.join(OWNER_FILE).is_file());
        let gone = dir.path().join(".gone.building");
        std::fs::create_dir(&gone).unwrap();
        // PID 1's identity with another start time: a reused PID.
        std::fs::write(gone.join(OWNER_FILE), "1 0").unwrap();
        let unowned = dir.path().join(".old.building");
        std::fs::create_dir(&unowned).unwrap();
        std::fs::create_dir(dir.path().join("not-a-build")).unwrap();
        let mut found = abandoned(dir.path());
        found.sort();
        assert_eq!(found, [gone, unowned]);
    }

    #[test]
    fn only_recordings_of_gone_owners_are_abandoned() {
        let dir = tempfile::tempdir().unwrap();
        let mine = dir.path().join("manifest-live");
        std::fs::create_dir(&mine).unwrap();
        claim(&mine).unwrap();
        let gone = dir.path().join("manifest-gone");
        std::fs::create_dir(&gone).unwrap();
        std::fs::write(gone.join(OWNER_FILE), "1 0").unwrap();
        std::fs::create_dir(dir.path().join("other-gone")).unwrap();
        assert_eq!(abandoned_with_prefix(dir.path(), "manifest-"), [gone]);
    }
}
