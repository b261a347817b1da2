//! Resolving guest users from `/etc/passwd` and `/etc/group`.
//!
//! The agent is linked statically, and glibc's `getpwnam` in a static binary
//! depends on NSS modules that may not match the guest's libc, so the files are
//! parsed directly.

use std::path::{Path, PathBuf};

use crate::rpc::{Code, RpcError};

/// A user the agent can act as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: PathBuf,
    pub shell: String,
}

/// Where the account databases live; tests point this at fixture files.
#[derive(Debug, Clone)]
pub struct UserDb {
    pub passwd: PathBuf,
    pub group: PathBuf,
}

impl Default for UserDb {
    fn default() -> Self {
        Self {
            passwd: PathBuf::from("/etc/passwd"),
            group: PathBuf::from("/etc/group"),
        }
    }
}

impl UserDb {
    /// Looks a user up by name; an unknown user is `invalid_argument`, as in envd.
    pub fn lookup(&self, name: &str) -> Result<User, RpcError> {
        let text = read(&self.passwd)?;
        text.lines()
            .filter_map(parse_passwd_line)
            .find(|u| u.name == name)
            .ok_or_else(|| RpcError::new(Code::InvalidArgument, format!("unknown user {name:?}")))
    }

    /// The name of `uid`, or the number itself when it has no entry.
    pub fn user_name(&self, uid: u32) -> String {
        read(&self.passwd)
            .ok()
            .and_then(|t| {
                t.lines()
                    .filter_map(parse_passwd_line)
                    .find(|u| u.uid == uid)
            })
            .map(|u| u.name)
            .unwrap_or_else(|| uid.to_string())
    }

    /// The name of `gid`, or the number itself when it has no entry.
    pub fn group_name(&self, gid: u32) -> String {
        read(&self.group)
            .ok()
            .and_then(|t| {
                t.lines().find_map(|line| {
                    let mut f = line.split(':');
                    let name = f.next()?;
                    let _pw = f.next()?;
                    (f.next()?.parse::<u32>().ok()? == gid).then(|| name.to_string())
                })
            })
            .unwrap_or_else(|| gid.to_string())
    }

    /// Supplementary groups of `user` (those listing it as a member).
    pub fn supplementary_gids(&self, user: &str) -> Vec<u32> {
        let Ok(text) = read(&self.group) else {
            return Vec::new();
        };
        text.lines()
            .filter_map(|line| {
                let f: Vec<&str> = line.split(':').collect();
                let gid = f.get(2)?.parse().ok()?;
                f.get(3)?.split(',').any(|m| m == user).then_some(gid)
            })
            .collect()
    }
}

fn read(path: &Path) -> Result<String, RpcError> {
    std::fs::read_to_string(path)
        .map_err(|e| RpcError::internal(format!("reading {}: {e}", path.display())))
}

fn parse_passwd_line(line: &str) -> Option<User> {
    let f: Vec<&str> = line.split(':').collect();
    if f.len() < 7 || line.starts_with('#') {
        return None;
    }
    Some(User {
        name: f[0].to_string(),
        uid: f[2].parse().ok()?,
        gid: f[3].parse().ok()?,
        home: PathBuf::from(f[5]),
        shell: f[6].to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_passwd_and_group() {
        let dir = tempfile::tempdir().unwrap();
        let passwd = dir.path().join("passwd");
        let group = dir.path().join("group");
        std::fs::write(
            &passwd,
            "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/bash\n",
        )
        .unwrap();
        std::fs::write(&group, "root:x:0:\nsudo:x:27:user\nuser:x:1000:\n").unwrap();
        let db = UserDb { passwd, group };
        let u = db.lookup("user").unwrap();
        assert_eq!(
            (u.uid, u.gid, u.home.as_path()),
            (1000, 1000, Path::new("/home/user"))
        );
        assert_eq!(db.lookup("nobody").unwrap_err().code, Code::InvalidArgument);
        assert_eq!(db.group_name(27), "sudo");
        assert_eq!(db.user_name(4242), "4242");
        assert_eq!(db.supplementary_gids("user"), vec![27]);
    }
}
