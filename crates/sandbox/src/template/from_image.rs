//! A build's base from an OCI image: fetch it (layers cached by digest in
//! `$SIESTA_HOME/cache/oci`), apply its layers to a directory, make that a
//! siesta guest (the agent as init, user `user`, identity files) and write
//! it as an ext4 disk with room to spare.
//!
//! The image's `Env`, `WorkingDir` and `User` become the template's
//! defaults; `Entrypoint`/`Cmd` and `ExposedPorts` are kept in the record,
//! not started (a template's start command is its own, see docs/templates.md).

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use siesta_image::{BlobStore, FetchOptions, Image, ImageSource};

use super::derive::{BuildLog, BuildPhase, LogLevel};
use super::record::TemplateDefaults;
use crate::error::{Error, IoContext, Result};
use crate::node::Node;
use crate::sandbox::GuestDefaults;

/// Free space a disk gets beyond what the image uses, unless the build
/// names a disk size.
pub const DEFAULT_FREE_MIB: u64 = 1024;

/// The node's image cache (`$SIESTA_HOME/cache/oci`).
pub(super) fn open_cache(node: &Node) -> Result<BlobStore> {
    Ok(BlobStore::open(node.config.layout().image_cache())?)
}

/// Fetches `source` into `store`.
pub(super) async fn fetch(
    store: &BlobStore,
    source: &ImageSource,
    opts: &FetchOptions,
    log: &BuildLog,
) -> Result<Image> {
    let progress = |event: siesta_image::ProgressEvent<'_>| match event {
        siesta_image::ProgressEvent::Line(line) => log(LogLevel::Info, &BuildPhase::Base, line),
        siesta_image::ProgressEvent::Bytes { layer, done, total } => log(
            LogLevel::Progress,
            &BuildPhase::Base,
            &progress_bar(layer, done, total),
        ),
    };
    let image = siesta_image::fetch(source, opts, store, &progress).await?;
    log(
        LogLevel::Info,
        &BuildPhase::Base,
        &format!(
            "image {} ({}): {} layers, {} pulled ({:.1} MiB), {} cached",
            image.reference,
            image.digest,
            image.layers.len(),
            image.fetched_layers,
            image.fetched_bytes as f64 / 1048576.0,
            image.cached_layers
        ),
    );
    Ok(image)
}

/// `layer 1a2b3c [########------------] 40% 21.8/54.5 MiB`.
fn progress_bar(layer: &str, done: u64, total: u64) -> String {
    const WIDTH: u64 = 24;
    let total = total.max(1);
    let filled = (done.min(total) * WIDTH / total) as usize;
    format!(
        "layer {layer} [{}{}] {:>3}% {:.1}/{:.1} MiB",
        "#".repeat(filled),
        "-".repeat(WIDTH as usize - filled),
        done.min(total) * 100 / total,
        done as f64 / 1048576.0,
        total as f64 / 1048576.0
    )
}

/// How big an image's disk is: `disk_mib` in all, else what the files use
/// plus `min_free_mib` (default [`DEFAULT_FREE_MIB`]) free.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct DiskRequest {
    pub disk_mib: Option<u32>,
    pub min_free_mib: Option<u32>,
}

/// Writes `image` as a bootable ext4 disk at `disk`, sized as `size` says;
/// returns the template defaults its config gives. `work` holds the
/// unpacked tree while this runs.
pub(super) async fn write_disk(
    node: &Node,
    store: &BlobStore,
    image: &Image,
    work: &Path,
    disk: &Path,
    size: DiskRequest,
    log: &BuildLog,
) -> Result<TemplateDefaults> {
    let layout = node.config.layout();
    let agent = layout.agent_bin();
    if !agent.is_file() {
        return Err(Error::Invalid(format!(
            "the guest agent {} is missing; run `make assets` (guest/build-assets.sh) first",
            agent.display()
        )));
    }
    let store = store.clone();
    let root = work.join("rootfs");
    let layers = image.layers.clone();
    let (root_c, image_c) = (root.clone(), image.clone());
    let prepared =
        tokio::task::spawn_blocking(move || -> Result<(TemplateDefaults, Vec<String>, Usage)> {
            siesta_image::unpack_layers(
                &store,
                &layers,
                &root_c,
                &siesta_image::ImageLimits::DEFAULT,
            )?;
            let notes = prepare_guest(&root_c, &agent)?;
            let defaults = defaults_of(&image_c, &root_c);
            Ok((defaults, notes, usage(&root_c)?))
        })
        .await
        .map_err(|e| Error::Invalid(format!("unpacking the image stopped: {e}")))?;
    let (defaults, notes, used) = match prepared {
        Ok(p) => p,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&root);
            return Err(e);
        }
    };
    for note in notes {
        log(LogLevel::Warn, &BuildPhase::Base, &note);
    }
    let size_mib = disk_size(used.bytes, size)?;
    log(
        LogLevel::Info,
        &BuildPhase::Base,
        &format!(
            "root file system: {} MiB in {} files, disk {size_mib} MiB",
            used.bytes >> 20,
            used.inodes
        ),
    );
    let made = mkfs(&root, disk, size_mib, used.inodes).await;
    let _ = tokio::fs::remove_dir_all(&root).await;
    made?;
    Ok(defaults)
}

/// The disk size in MiB: the one asked for (refused when the image does
/// not fit), else what the image uses plus a fifth for ext4's own metadata
/// and the free space asked for.
fn disk_size(used_bytes: u64, size: DiskRequest) -> Result<u64> {
    let used_mib = used_bytes.div_ceil(1 << 20);
    let needed = used_mib + (used_mib / 5).max(64);
    let free = size.min_free_mib.map_or(DEFAULT_FREE_MIB, u64::from);
    match size.disk_mib {
        Some(mib) if u64::from(mib) < needed + size.min_free_mib.map_or(0, u64::from) => {
            Err(Error::Invalid(format!(
                "a disk of {mib} MiB is too small: the image's files take {used_mib} MiB, so ask for at least {} MiB",
                needed + size.min_free_mib.map_or(0, u64::from)
            )))
        }
        Some(mib) => Ok(u64::from(mib)),
        None => Ok(needed + free),
    }
}

struct Usage {
    bytes: u64,
    inodes: u64,
}

/// Space (allocated blocks) and inodes the tree uses.
fn usage(root: &Path) -> Result<Usage> {
    let mut u = Usage {
        bytes: 0,
        inodes: 0,
    };
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).ctx("measuring the root file system", &dir)? {
            let entry = entry.ctx("measuring the root file system", &dir)?;
            let m = entry
                .metadata()
                .ctx("measuring the root file system", entry.path())?;
            u.inodes += 1;
            u.bytes += m.blocks() * 512 + 4096;
            if m.is_dir() {
                stack.push(entry.path());
            }
        }
    }
    Ok(u)
}

async fn mkfs(root: &Path, disk: &Path, size_mib: u64, inodes: u64) -> Result<()> {
    let out = tokio::process::Command::new("mkfs.ext4")
        .args(["-q", "-F", "-L", "siesta-root", "-N"])
        .arg((inodes * 2 + 32768).to_string())
        .arg("-d")
        .arg(root)
        .arg(disk)
        .arg(format!("{size_mib}M"))
        .output()
        .await
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Error::MissingTool {
                command: "mkfs.ext4".into(),
                package: "e2fsprogs".into(),
                used_for: "writes template disks".into(),
            },
            _ => Error::Io {
                what: "running mkfs.ext4 for",
                path: disk.to_path_buf(),
                source: e,
            },
        })?;
    if !out.status.success() {
        let _ = tokio::fs::remove_file(disk).await;
        return Err(Error::Command {
            what: format!("mkfs.ext4 -d for a {size_mib} MiB disk"),
            detail: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(())
}

/// `root/rel`, its parent directories made, refusing a path that resolves
/// outside `root` through an absolute or escaping symbolic link in the
/// image. Each directory is checked before anything is made inside it.
fn guest_path(root: &Path, rel: &str) -> Result<PathBuf> {
    let rel = Path::new(rel);
    if let Some(parent) = rel.parent() {
        guest_dir(root, parent)?;
    }
    Ok(root.join(rel))
}

/// `root/rel` as a directory inside `root`, made where missing.
fn guest_dir(root: &Path, rel: &Path) -> Result<PathBuf> {
    let canon_root = root.canonicalize().ctx("resolving the guest tree", root)?;
    let mut dir = root.to_path_buf();
    for part in rel.components() {
        dir.push(part);
        if std::fs::symlink_metadata(&dir).is_err() {
            std::fs::create_dir(&dir).ctx("creating a directory in the guest tree", &dir)?;
        }
        let canon = dir
            .canonicalize()
            .ctx("resolving a guest directory", &dir)?;
        if !canon.starts_with(&canon_root) {
            return Err(Error::Invalid(format!(
                "the image's /{} leads outside the image (a symbolic link to {}); siesta cannot add its files there",
                dir.strip_prefix(root).unwrap_or(&dir).display(),
                canon.display()
            )));
        }
    }
    Ok(dir)
}

/// Replaces whatever is at `rel` (a link included) with `content`.
fn write_guest_file(root: &Path, rel: &str, content: &[u8], mode: u32) -> Result<()> {
    let path = guest_path(root, rel)?;
    if std::fs::symlink_metadata(&path).is_ok() {
        std::fs::remove_file(&path).ctx("replacing a guest file", &path)?;
    }
    std::fs::write(&path, content).ctx("writing a guest file", &path)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
        .ctx("setting the mode of a guest file", &path)?;
    std::os::unix::fs::lchown(&path, Some(0), Some(0))
        .ctx("setting the owner of a guest file", &path)
}

/// Makes the unpacked tree a siesta guest; returns notes for the build log.
fn prepare_guest(root: &Path, agent: &Path) -> Result<Vec<String>> {
    let mut notes = Vec::new();
    for (dir, mode) in [
        ("proc", 0o555),
        ("sys", 0o555),
        ("dev", 0o755),
        ("run", 0o755),
        ("tmp", 0o1777),
        ("var/tmp", 0o1777),
        ("root", 0o700),
    ] {
        if std::fs::symlink_metadata(root.join(dir)).is_err() {
            let p = guest_dir(root, Path::new(dir))?;
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode))
                .ctx("setting the mode of a guest directory", &p)?;
        }
    }
    let agent_bytes = std::fs::read(agent).ctx("reading the guest agent", agent)?;
    write_guest_file(root, "usr/local/bin/siesta-agent", &agent_bytes, 0o755)?;
    let host = "siesta";
    write_guest_file(root, "etc/hostname", format!("{host}\n").as_bytes(), 0o644)?;
    write_guest_file(
        root,
        "etc/hosts",
        format!(
            "127.0.0.1\tlocalhost\n127.0.1.1\t{host}\n::1\tlocalhost ip6-localhost ip6-loopback\n"
        )
        .as_bytes(),
        0o644,
    )?;
    // The runtime writes the guest's resolver; a link into /run would dangle.
    write_guest_file(root, "etc/resolv.conf", b"", 0o644)?;
    write_guest_file(root, "etc/machine-id", b"", 0o444)?;
    if !exists_in(root, "bin/bash") && !exists_in(root, "usr/bin/bash") {
        if exists_in(root, "bin/sh") {
            write_guest_file(root, "bin/bash", b"#!/bin/sh\nexec /bin/sh \"$@\"\n", 0o755)?;
            notes.push("the image has no bash: /bin/bash runs /bin/sh (the SDK runs commands with bash -l -c)".into());
        } else {
            notes.push(
                "the image has neither bash nor /bin/sh: commands from the SDK will not run".into(),
            );
        }
    }
    notes.extend(ensure_user(root)?);
    Ok(notes)
}

/// Whether `rel` exists in the tree, following links inside it.
fn exists_in(root: &Path, rel: &str) -> bool {
    let mut p = root.join(rel);
    for _ in 0..16 {
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => match std::fs::read_link(&p) {
                Ok(t) if t.is_absolute() => p = root.join(t.strip_prefix("/").unwrap_or(&t)),
                Ok(t) => p = p.parent().unwrap_or(root).join(t),
                Err(_) => return false,
            },
            Ok(_) => return true,
            Err(_) => return false,
        }
    }
    false
}

/// Lines of `/etc/passwd` (or `group`) as fields.
fn table(root: &Path, rel: &str) -> Vec<Vec<String>> {
    std::fs::read_to_string(root.join(rel))
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| l.split(':').map(str::to_string).collect())
        .collect()
}

fn append_line(root: &Path, rel: &str, line: &str) -> Result<()> {
    use std::io::Write;
    let path = guest_path(root, rel)?;
    let mut text = std::fs::read_to_string(&path).unwrap_or_default();
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(&path)
        .ctx("writing a guest account file", &path)?;
    f.write_all(text.as_bytes())
        .and_then(|()| writeln!(f, "{line}"))
        .ctx("writing a guest account file", &path)
}

/// Creates user `user` (uid 1000, or the first free uid above it; home
/// `/home/user`; passwordless sudo) when the image has none.
fn ensure_user(root: &Path) -> Result<Vec<String>> {
    let passwd = table(root, "etc/passwd");
    if passwd.iter().any(|f| f[0] == "user") {
        return Ok(Vec::new());
    }
    let groups = table(root, "etc/group");
    let taken = |t: &[Vec<String>], id: u32| {
        t.iter()
            .any(|f| f.get(2).is_some_and(|v| v == &id.to_string()))
    };
    let uid = (1000..60000).find(|&u| !taken(&passwd, u)).unwrap_or(1000);
    let gid = if taken(&groups, uid) {
        (1000..60000).find(|&g| !taken(&groups, g)).unwrap_or(uid)
    } else {
        uid
    };
    let shell = if exists_in(root, "bin/bash") {
        "/bin/bash"
    } else {
        "/bin/sh"
    };
    append_line(
        root,
        "etc/passwd",
        &format!("user:x:{uid}:{gid}:user:/home/user:{shell}"),
    )?;
    append_line(root, "etc/group", &format!("user:x:{gid}:"))?;
    if root.join("etc/shadow").exists() {
        append_line(root, "etc/shadow", "user:*:19000:0:99999:7:::")?;
    }
    let home = guest_dir(root, Path::new("home/user"))?;
    std::os::unix::fs::lchown(&home, Some(uid), Some(gid)).ctx("setting the owner of", &home)?;
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o755))
        .ctx("setting the mode of", &home)?;
    write_guest_file(
        root,
        "etc/sudoers.d/90-siesta-user",
        b"user ALL=(ALL:ALL) NOPASSWD: ALL\n",
        0o440,
    )?;
    let mut notes = vec![format!("added user `user` (uid {uid}, /home/user)")];
    if !exists_in(root, "usr/bin/sudo") && !exists_in(root, "bin/sudo") {
        notes.push("the image has no sudo: `user` cannot become root".into());
    }
    Ok(notes)
}

/// The template defaults an image's config gives: its environment, its
/// user (E2B's `user` when it names none), and its working directory (else
/// that user's home).
fn defaults_of(image: &Image, root: &Path) -> TemplateDefaults {
    let c = &image.config;
    let passwd = table(root, "etc/passwd");
    let user = match c.user.as_deref().map(|u| u.split(':').next().unwrap_or(u)) {
        None | Some("") => "user".to_string(),
        Some(u) if u.bytes().all(|b| b.is_ascii_digit()) => passwd
            .iter()
            .find(|f| f.get(2).is_some_and(|v| v == u))
            .map_or_else(|| u.to_string(), |f| f[0].clone()),
        Some(u) => u.to_string(),
    };
    let home = passwd
        .iter()
        .find(|f| f[0] == user)
        .and_then(|f| f.get(5).cloned())
        .filter(|h| !h.is_empty());
    let workdir = c.workdir.clone().or(home).unwrap_or_else(|| "/".into());
    let env: BTreeMap<String, String> = c.env.iter().cloned().collect();
    TemplateDefaults {
        env,
        guest: GuestDefaults { user, workdir },
        start_cmd: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_bars_fill_with_the_bytes() {
        assert_eq!(
            progress_bar("abc", 0, 4 << 20),
            "layer abc [------------------------]   0% 0.0/4.0 MiB"
        );
        assert_eq!(
            progress_bar("abc", 2 << 20, 4 << 20),
            "layer abc [############------------]  50% 2.0/4.0 MiB"
        );
        assert!(progress_bar("abc", 9, 0).contains("100%"));
    }

    #[test]
    fn disk_sizes_leave_room_or_say_what_fits() {
        let used = 300 << 20;
        let ask = |disk_mib, min_free_mib| DiskRequest {
            disk_mib,
            min_free_mib,
        };
        assert_eq!(
            disk_size(used, ask(None, None)).unwrap(),
            300 + 64 + DEFAULT_FREE_MIB
        );
        assert_eq!(
            disk_size(used, ask(None, Some(100))).unwrap(),
            300 + 64 + 100
        );
        assert_eq!(disk_size(used, ask(Some(4096), None)).unwrap(), 4096);
        let e = disk_size(used, ask(Some(200), None))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("too small") && e.contains("at least 364 MiB"),
            "{e}"
        );
    }

    #[test]
    fn a_guest_gets_the_agent_a_user_and_a_shell() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("etc")).unwrap();
        std::fs::create_dir_all(root.join("bin")).unwrap();
        std::fs::write(root.join("bin/sh"), b"").unwrap();
        std::fs::write(
            root.join("etc/passwd"),
            "root:x:0:0:root:/root:/bin/sh\nnode:x:1000:1000::/home/node:/bin/sh",
        )
        .unwrap();
        std::fs::write(root.join("etc/group"), "root:x:0:\nnode:x:1000:\n").unwrap();
        let agent = dir.path().join("agent");
        std::fs::write(&agent, b"\x7fELF").unwrap();
        let notes = prepare_guest(&root, &agent).unwrap();
        assert!(notes.iter().any(|n| n.contains("no bash")), "{notes:?}");
        let passwd = std::fs::read_to_string(root.join("etc/passwd")).unwrap();
        assert!(passwd.contains("\nnode:x:1000:1000::/home/node:/bin/sh\nuser:x:1001:1001:user:/home/user:/bin/bash\n"), "{passwd}");
        assert_eq!(
            std::fs::metadata(root.join("home/user")).unwrap().uid(),
            1001
        );
        assert_eq!(
            std::fs::read(root.join("usr/local/bin/siesta-agent")).unwrap(),
            b"\x7fELF"
        );
        assert!(root.join("etc/sudoers.d/90-siesta-user").is_file());
        assert_eq!(
            std::fs::metadata(root.join("tmp"))
                .unwrap()
                .permissions()
                .mode()
                & 0o7777,
            0o1777
        );
        // Twice is the same as once.
        prepare_guest(&root, &agent).unwrap();
        let again = std::fs::read_to_string(root.join("etc/passwd")).unwrap();
        assert_eq!(again.matches("user:x:").count(), 1);
    }

    #[test]
    fn links_out_of_the_image_are_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("usr")).unwrap();
        let outside = dir.path().join("host-bin");
        std::fs::create_dir_all(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("usr/local")).unwrap();
        let agent = dir.path().join("agent");
        std::fs::write(&agent, b"x").unwrap();
        let e = prepare_guest(&root, &agent).unwrap_err().to_string();
        assert!(e.contains("leads outside the image"), "{e}");
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
    }

    #[test]
    fn image_config_becomes_the_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("etc")).unwrap();
        std::fs::write(
            root.join("etc/passwd"),
            "root:x:0:0::/root:/bin/sh\napp:x:1000:1000::/srv/app:/bin/sh\n",
        )
        .unwrap();
        let config = siesta_image::ImageConfig {
            env: vec![("PATH".into(), "/opt/bin:/usr/bin".into())],
            user: Some("1000:1000".into()),
            ..Default::default()
        };
        let image = Image {
            reference: "x".into(),
            digest: "sha256:00".into(),
            config,
            layers: vec![],
            fetched_layers: 0,
            cached_layers: 0,
            fetched_bytes: 0,
        };
        let d = defaults_of(&image, root);
        assert_eq!(d.guest.user, "app");
        assert_eq!(d.guest.workdir, "/srv/app");
        assert_eq!(d.env["PATH"], "/opt/bin:/usr/bin");
        let mut plain = image.clone();
        plain.config.user = None;
        plain.config.workdir = Some("/work".into());
        let d = defaults_of(&plain, root);
        assert_eq!(
            (d.guest.user.as_str(), d.guest.workdir.as_str()),
            ("user", "/work")
        );
    }
}
