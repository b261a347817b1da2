//! The build context of `siesta template build -f`: turns a Dockerfile's
//! COPY sources into tar archives (names relative to the context, links
//! kept as links) stored by their SHA-256 under `$SIESTA_HOME/build-files`,
//! where the build's COPY steps read them.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use sha2::{Digest, Sha256};
use siesta_template::dockerfile::CopySpec;
use siesta_template::Step;

/// The COPY step for `spec`, with its files archived from `context`.
pub fn copy_step(context: &Path, spec: &CopySpec, files: &Path) -> anyhow::Result<Step> {
    let root = context
        .canonicalize()
        .with_context(|| format!("the build context {}", context.display()))?;
    let mut members = Vec::new();
    for source in &spec.sources {
        members.extend(matches(&root, source, spec.line)?);
    }
    std::fs::create_dir_all(files).with_context(|| format!("creating {}", files.display()))?;
    let part = files.join(format!(".cli-{}.part", std::process::id()));
    let written = write_archive(&root, &members, &part);
    let digest = match written.and_then(|()| digest_of(&part)) {
        Ok(d) => d,
        Err(e) => {
            let _ = std::fs::remove_file(&part);
            return Err(e);
        }
    };
    let archive = files.join(format!("{digest}.tar"));
    std::fs::rename(&part, &archive).with_context(|| format!("storing {}", archive.display()))?;
    Ok(Step::Copy {
        archive,
        sources: spec.sources.clone(),
        digest,
        dest: spec.dest.clone(),
        owner: spec.owner.clone(),
        mode: spec.mode,
    })
}

/// The context-relative paths `source` names (a path or a glob), each
/// checked to stay inside the context.
fn matches(root: &Path, source: &str, line: usize) -> anyhow::Result<Vec<PathBuf>> {
    let rel = source.trim_start_matches("./");
    if Path::new(rel).is_absolute() || Path::new(rel).components().any(|c| c.as_os_str() == "..") {
        bail!(
            "line {line}: COPY source {source:?} is outside the build context {}",
            root.display()
        );
    }
    let pattern = root.join(rel);
    let pattern = pattern.to_string_lossy();
    let mut out = Vec::new();
    for entry in
        glob::glob(&pattern).with_context(|| format!("line {line}: bad pattern {source:?}"))?
    {
        let path = entry.with_context(|| format!("line {line}: reading {source:?}"))?;
        // A link may point anywhere; it is archived as a link, but a link
        // that the glob itself went through must stay inside.
        let parent = path.parent().unwrap_or(root);
        let real_parent = parent
            .canonicalize()
            .unwrap_or_else(|_| parent.to_path_buf());
        if !real_parent.starts_with(root) {
            bail!(
                "line {line}: COPY source {} is outside the build context {}",
                path.display(),
                root.display()
            );
        }
        let relative = path.strip_prefix(root).unwrap_or(&path).to_path_buf();
        out.push(relative);
    }
    if out.is_empty() {
        bail!(
            "line {line}: COPY source {source:?} not found in the build context {}",
            root.display()
        );
    }
    Ok(out)
}

fn write_archive(root: &Path, members: &[PathBuf], out: &Path) -> anyhow::Result<()> {
    let file = std::fs::File::create(out).with_context(|| format!("creating {}", out.display()))?;
    let mut tar = tar::Builder::new(file);
    tar.follow_symlinks(false);
    for m in members {
        let full = root.join(m);
        let meta = std::fs::symlink_metadata(&full)
            .with_context(|| format!("reading {}", full.display()))?;
        if meta.is_dir() {
            tar.append_dir_all(m, &full)
        } else {
            tar.append_path_with_name(&full, m)
        }
        .with_context(|| format!("archiving {}", full.display()))?;
    }
    let file = tar.into_inner().context("finishing the archive")?;
    file.sync_all().context("syncing the archive")?;
    Ok(())
}

fn digest_of(path: &Path) -> anyhow::Result<String> {
    let mut f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h).with_context(|| format!("reading {}", path.display()))?;
    Ok(hex::encode(h.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(sources: &[&str]) -> CopySpec {
        CopySpec {
            line: 3,
            sources: sources.iter().map(|s| s.to_string()).collect(),
            dest: "/app/".into(),
            owner: None,
            mode: None,
        }
    }

    #[test]
    fn archives_by_content_and_refuses_escapes() {
        let ctx = tempfile::tempdir().unwrap();
        let files = tempfile::tempdir().unwrap();
        std::fs::create_dir(ctx.path().join("src")).unwrap();
        std::fs::write(ctx.path().join("src/a.py"), "print(1)").unwrap();
        std::fs::write(ctx.path().join("src/b.py"), "print(2)").unwrap();
        let one = copy_step(ctx.path(), &spec(&["src/*.py"]), files.path()).unwrap();
        let two = copy_step(ctx.path(), &spec(&["src/*.py"]), files.path()).unwrap();
        let (
            Step::Copy {
                digest: d1,
                archive,
                ..
            },
            Step::Copy { digest: d2, .. },
        ) = (one, two)
        else {
            panic!("not a COPY");
        };
        assert_eq!(d1, d2, "the same files archive to the same digest");
        let names: Vec<String> = tar::Archive::new(std::fs::File::open(&archive).unwrap())
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        assert_eq!(names, ["src/a.py", "src/b.py"]);

        let err = |s: &str| {
            copy_step(ctx.path(), &spec(&[s]), files.path())
                .unwrap_err()
                .to_string()
        };
        assert!(err("../etc/passwd").contains("outside the build context"));
        assert!(err("/etc/passwd").contains("outside the build context"));
        assert!(err("missing.txt").contains("not found"));
        assert!(err("missing.txt").starts_with("line 3:"));
    }
}
