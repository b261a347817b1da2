//! Turning the paths clients send into absolute paths.
//!
//! envd expands `~` and resolves relative paths against the home of the user
//! the request acts as, then cleans the result lexically (like Go's
//! `filepath.Abs`): `..` is applied to the text, not by following symlinks,
//! so `/a/link/..` is `/a` whatever `link` points to.

use std::path::{Component, Path, PathBuf};

/// Resolves `raw` for a user whose home is `home`.
///
/// `""`, `"~"` and `"."` are the home itself; `"~/x"` and `"x"` are under it;
/// an absolute path is only cleaned.
pub fn resolve(raw: &str, home: &Path) -> PathBuf {
    let joined = if raw.is_empty() || raw == "~" {
        home.to_path_buf()
    } else if let Some(rest) = raw.strip_prefix("~/") {
        home.join(rest)
    } else if raw.starts_with('/') {
        PathBuf::from(raw)
    } else {
        home.join(raw)
    };
    clean(&joined)
}

/// Lexically normalises an absolute path: drops `.` and empty components and
/// applies `..` (which stops at `/`). A relative input is taken from `/`.
pub fn clean(path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in path.components() {
        match c {
            Component::Normal(part) => out.push(part),
            Component::ParentDir => {
                out.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

/// The last component of `path`, or `/` for the root (Go's `filepath.Base`).
pub fn base_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "/".to_string())
}

/// `path` as text for the wire; non-UTF-8 bytes are replaced, as the proto
/// field is a `string`.
pub fn display(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_like_envd() {
        let home = Path::new("/home/user");
        let r = |s| resolve(s, home);
        assert_eq!(r(""), Path::new("/home/user"));
        assert_eq!(r("~"), Path::new("/home/user"));
        assert_eq!(r("."), Path::new("/home/user"));
        assert_eq!(r("~/a/b"), Path::new("/home/user/a/b"));
        assert_eq!(r("a/./b/"), Path::new("/home/user/a/b"));
        assert_eq!(r("../../../etc"), Path::new("/etc"));
        assert_eq!(r("/tmp//x/../y"), Path::new("/tmp/y"));
        assert_eq!(r("/.."), Path::new("/"));
        // `~user` is not expanded by envd either: it is a relative name.
        assert_eq!(r("~other"), Path::new("/home/user/~other"));
    }

    #[test]
    fn base_names() {
        assert_eq!(base_name(Path::new("/a/b.txt")), "b.txt");
        assert_eq!(base_name(Path::new("/")), "/");
    }
}
