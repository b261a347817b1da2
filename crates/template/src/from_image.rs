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
use std::path::Path;

use siesta_image::{BlobStore, FetchOptions, Image, ImageLimits, ImageSource};

use crate::derive::{BuildLog, BuildPhase, LogLevel};
use crate::error::{Error, IoContext, Result};
use crate::guest_tree::GuestTree;
use crate::record::TemplateDefaults;
use siesta_envd_client::GuestDefaults;
use siesta_host::Host;

/// Free space a disk gets beyond what the image uses, unless the build
/// names a disk size.
pub const DEFAULT_FREE_MIB: u64 = 1024;

/// The node's image cache (`$SIESTA_HOME/cache/oci`).
pub(crate) fn open_cache(node: &Host) -> Result<BlobStore> {
    Ok(BlobStore::open(node.config.layout().image_cache())?)
}

/// Fetches `source` into `store`.
pub(crate) async fn fetch(
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
pub(crate) struct DiskRequest {
    pub disk_mib: Option<u32>,
    pub min_free_mib: Option<u32>,
}

/// Writes `image` as a bootable ext4 disk at `disk`, sized as `size` says;
/// returns the template defaults its config gives. `work` holds the
/// unpacked tree while this runs.
pub(crate) async fn write_disk(
    node: &Host,
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
    let (store, image_c) = (store.clone(), image.clone());
    let root = work.join("rootfs");
    let root_c = root.clone();
    let limits = node.config.image_limits();
    let Prepared {
        defaults,
        notes,
        used,
    } = tokio::task::spawn_blocking(move || {
        unpack_and_prepare(&store, &image_c, &root_c, &agent, &limits)
    })
    .await
    .map_err(|e| crate::error::internal("unpacking the image", e))??;
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

/// An image unpacked and made a guest: its defaults, notes for the build
/// log, and what its files use.
struct Prepared {
    defaults: TemplateDefaults,
    notes: Vec<String>,
    used: Usage,
}

/// Applies `image`'s layers to `root` (within `limits`) and makes the tree
/// a guest; on an error nothing is left at `root`.
fn unpack_and_prepare(
    store: &BlobStore,
    image: &Image,
    root: &Path,
    agent: &Path,
    limits: &ImageLimits,
) -> Result<Prepared> {
    let prepared = (|| {
        siesta_image::unpack_layers(store, &image.layers, root, limits)?;
        let notes = prepare_guest(root, agent)?;
        let passwd = table(&GuestTree::open(root)?, "etc/passwd")?;
        Ok(Prepared {
            defaults: defaults_of(image, &passwd),
            notes,
            used: usage(root)?,
        })
    })();
    if prepared.is_err() {
        let _ = std::fs::remove_dir_all(root);
    }
    prepared
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
            std::io::ErrorKind::NotFound => Error::Host(siesta_host::HostError::MissingTool {
                command: "mkfs.ext4".into(),
                package: "e2fsprogs".into(),
                used_for: "writes template disks".into(),
            }),
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

/// Makes the unpacked tree a siesta guest; returns notes for the build log.
///
/// Every access goes through [`GuestTree`], so a link in the image can
/// never lead a write to the host. The files siesta owns (the agent,
/// `/etc/hostname`, `/etc/hosts`, `/etc/resolv.conf`, `/etc/machine-id`,
/// the sudoers drop-in, a stand-in `/bin/bash`) replace whatever entry the
/// image has there, a link included. The account files (`/etc/passwd`,
/// `/etc/group`, `/etc/shadow`) are the image's: a link among them is
/// followed inside the image, as the guest would, and the file it leads to
/// is appended to; when that is not a regular file (a directory, a pipe, a
/// link to nothing in the image) the build fails naming it, rather than
/// guess which file the image meant.
fn prepare_guest(root: &Path, agent: &Path) -> Result<Vec<String>> {
    let tree = GuestTree::open(root)?;
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
        if !tree.present(dir) {
            tree.dir(dir)?
                .set_permissions(std::fs::Permissions::from_mode(mode))
                .ctx("setting the mode of a guest directory", root.join(dir))?;
        }
    }
    let agent_bytes = std::fs::read(agent).ctx("reading the guest agent", agent)?;
    tree.replace_file("usr/local/bin/siesta-agent", &agent_bytes, 0o755)?;
    let host = "siesta";
    tree.replace_file("etc/hostname", format!("{host}\n").as_bytes(), 0o644)?;
    tree.replace_file(
        "etc/hosts",
        format!(
            "127.0.0.1\tlocalhost\n127.0.1.1\t{host}\n::1\tlocalhost ip6-localhost ip6-loopback\n"
        )
        .as_bytes(),
        0o644,
    )?;
    // The runtime writes the guest's resolver; a link into /run would dangle.
    tree.replace_file("etc/resolv.conf", b"", 0o644)?;
    tree.replace_file("etc/machine-id", b"", 0o444)?;
    if !tree.exists("bin/bash") && !tree.exists("usr/bin/bash") {
        if tree.exists("bin/sh") {
            tree.replace_file("bin/bash", b"#!/bin/sh\nexec /bin/sh \"$@\"\n", 0o755)?;
            notes.push("the image has no bash: /bin/bash runs /bin/sh (the SDK runs commands with bash -l -c)".into());
        } else {
            notes.push(
                "the image has neither bash nor /bin/sh: commands from the SDK will not run".into(),
            );
        }
    }
    notes.extend(ensure_user(&tree)?);
    Ok(notes)
}

/// The most of an account file read: real ones are a few KiB.
const ACCOUNT_FILE_MAX: u64 = 16 << 20;

/// Lines of `/etc/passwd` (or `group`) as fields; none when it is missing.
fn table(tree: &GuestTree, rel: &str) -> Result<Vec<Vec<String>>> {
    let bytes = tree.read_file(rel, ACCOUNT_FILE_MAX)?.unwrap_or_default();
    Ok(String::from_utf8_lossy(&bytes)
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| l.split(':').map(str::to_string).collect())
        .collect())
}

/// Creates user `user` (uid 1000, or the first free uid above it; home
/// `/home/user`; passwordless sudo) when the image has none.
fn ensure_user(tree: &GuestTree) -> Result<Vec<String>> {
    let passwd = table(tree, "etc/passwd")?;
    if passwd.iter().any(|f| f[0] == "user") {
        return Ok(Vec::new());
    }
    let groups = table(tree, "etc/group")?;
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
    let shell = if tree.exists("bin/bash") {
        "/bin/bash"
    } else {
        "/bin/sh"
    };
    tree.append_line(
        "etc/passwd",
        &format!("user:x:{uid}:{gid}:user:/home/user:{shell}"),
        0o644,
    )?;
    tree.append_line("etc/group", &format!("user:x:{gid}:"), 0o644)?;
    // Only where the image keeps one; a shadow-less image has none made.
    if tree.exists("etc/shadow") {
        tree.append_line("etc/shadow", "user:*:19000:0:99999:7:::", 0o640)?;
    }
    let home = tree.dir("home/user")?;
    let home_path = tree.host_path("home/user");
    std::os::unix::fs::fchown(&home, Some(uid), Some(gid))
        .ctx("setting the owner of", &home_path)?;
    home.set_permissions(std::fs::Permissions::from_mode(0o755))
        .ctx("setting the mode of", &home_path)?;
    tree.replace_file(
        "etc/sudoers.d/90-siesta-user",
        b"user ALL=(ALL:ALL) NOPASSWD: ALL\n",
        0o440,
    )?;
    let mut notes = vec![format!("added user `user` (uid {uid}, /home/user)")];
    if !tree.exists("usr/bin/sudo") && !tree.exists("bin/sudo") {
        notes.push("the image has no sudo: `user` cannot become root".into());
    }
    Ok(notes)
}

/// The template defaults an image's config gives: its environment, its
/// user (E2B's `user` when it names none), and its working directory (else
/// that user's home).
fn defaults_of(image: &Image, passwd: &[Vec<String>]) -> TemplateDefaults {
    let c = &image.config;
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
mod hostile_trees;

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
        assert!(e.contains("/usr/local is a symbolic link to"), "{e}");
        assert!(e.contains("which is not in the image"), "{e}");
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
        let passwd = table(&GuestTree::open(root).unwrap(), "etc/passwd").unwrap();
        let d = defaults_of(&image, &passwd);
        assert_eq!(d.guest.user, "app");
        assert_eq!(d.guest.workdir, "/srv/app");
        assert_eq!(d.env["PATH"], "/opt/bin:/usr/bin");
        let mut plain = image.clone();
        plain.config.user = None;
        plain.config.workdir = Some("/work".into());
        let d = defaults_of(&plain, &passwd);
        assert_eq!(
            (d.guest.user.as_str(), d.guest.workdir.as_str()),
            ("user", "/work")
        );
    }
}
