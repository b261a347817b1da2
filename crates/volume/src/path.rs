//! Paths inside a volume.
//!
//! The API takes paths as the SDK sends them: `/dir/file.txt` or
//! `dir/file.txt`, both relative to the volume's root. A `..` component is
//! refused outright rather than resolved: it is never needed to name a file
//! inside a volume, and refusing it keeps "which file did this name?"
//! obvious. Symbolic links are the other way out; [`crate::VolumeFs`]
//! resolves through `cap-std`, which refuses those that leave the root.

use std::path::PathBuf;

use crate::error::{VolumeError, VolumeResult};

/// Longest path accepted, in bytes (Linux's `PATH_MAX`).
const MAX_PATH_BYTES: usize = 4096;

/// A normalized path inside a volume: no `..`, no empty or `.` components.
/// The root is the empty path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumePath {
    parts: Vec<String>,
}

impl VolumePath {
    /// The volume's root.
    pub fn root() -> Self {
        Self { parts: Vec::new() }
    }

    /// Parses a path as the API receives it.
    pub fn parse(raw: &str) -> VolumeResult<Self> {
        let bad = |why| VolumeError::BadPath {
            path: raw.to_string(),
            why,
        };
        if raw.len() > MAX_PATH_BYTES {
            return Err(bad("longer than 4096 bytes"));
        }
        if raw.contains('\0') {
            return Err(bad("contains a NUL byte"));
        }
        let mut parts = Vec::new();
        for part in raw.trim().split('/') {
            match part {
                "" | "." => {}
                ".." => {
                    return Err(bad(
                        "`..` is not allowed: name paths from the volume's root",
                    ))
                }
                p => parts.push(p.to_string()),
            }
        }
        Ok(Self { parts })
    }

    pub fn is_root(&self) -> bool {
        self.parts.is_empty()
    }

    /// The last component (`/` for the root), as stat reports `name`.
    pub fn name(&self) -> &str {
        self.parts.last().map(String::as_str).unwrap_or("/")
    }

    /// The path relative to the volume's root, `.` for the root: what
    /// `cap-std` resolves.
    pub fn relative(&self) -> PathBuf {
        if self.parts.is_empty() {
            PathBuf::from(".")
        } else {
            self.parts.iter().collect()
        }
    }

    /// The parent directory (the root's parent is the root).
    pub fn parent(&self) -> Self {
        let mut parts = self.parts.clone();
        parts.pop();
        Self { parts }
    }

    /// `self/name`.
    pub fn join(&self, name: &str) -> Self {
        let mut parts = self.parts.clone();
        parts.push(name.to_string());
        Self { parts }
    }

    /// Every ancestor from the first component down to `self`.
    pub fn ancestors_and_self(&self) -> impl Iterator<Item = Self> + '_ {
        (1..=self.parts.len()).map(|n| Self {
            parts: self.parts[..n].to_vec(),
        })
    }
}

impl std::fmt::Display for VolumePath {
    /// As the API reports it: absolute from the volume's root.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "/{}", self.parts.join("/"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absolute_and_relative_names_are_the_same_path() {
        let a = VolumePath::parse("/dir//sub/./file.txt").unwrap();
        let b = VolumePath::parse("dir/sub/file.txt").unwrap();
        assert_eq!(a, b);
        assert_eq!(a.to_string(), "/dir/sub/file.txt");
        assert_eq!(a.name(), "file.txt");
        assert_eq!(a.relative(), PathBuf::from("dir/sub/file.txt"));
        assert_eq!(a.parent().to_string(), "/dir/sub");
    }

    #[test]
    fn the_root_has_several_spellings() {
        for raw in ["", "/", " / ", ".", "/./"] {
            let p = VolumePath::parse(raw).unwrap();
            assert!(p.is_root(), "{raw:?}");
            assert_eq!(p.to_string(), "/");
            assert_eq!(p.relative(), PathBuf::from("."));
        }
    }

    #[test]
    fn dot_dot_and_nul_are_refused() {
        for raw in ["..", "/../etc/passwd", "a/../../b", "a/..", "x\0y"] {
            let err = VolumePath::parse(raw).unwrap_err();
            assert!(matches!(err, VolumeError::BadPath { .. }), "{raw:?}: {err}");
        }
        assert!(VolumePath::parse(&"a/".repeat(3000)).is_err());
    }

    #[test]
    fn ancestors_come_from_the_top() {
        let p = VolumePath::parse("/a/b/c").unwrap();
        let all: Vec<String> = p.ancestors_and_self().map(|a| a.to_string()).collect();
        assert_eq!(all, ["/a", "/a/b", "/a/b/c"]);
    }
}
