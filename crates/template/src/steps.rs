//! What a template build with steps does: its source, its steps, and the
//! key under which its result is cached.
//!
//! The steps are those of the E2B template builder (and of the Dockerfile
//! subset `siesta template build -f` reads): RUN, COPY, ENV, WORKDIR, USER,
//! then an optional start command with its ready check. They run in a VM
//! booted from the source template's disk; `derive.rs` executes them.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Serialize;
use sha2::{Digest, Sha256};

/// Where a build starts from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum BuildSource {
    /// An existing template's disk (`fromTemplate`, `FROM <template>`).
    Template(String),
    /// An OCI image (`fromImage`, `FROM <image>`, `--image`): a registry
    /// reference, `oci:DIR[:TAG]` or `docker-archive:FILE`.
    Image {
        reference: String,
        /// Registry credentials; never part of the cache key or a log.
        #[serde(skip)]
        credentials: Option<siesta_image::Credentials>,
        /// Where its pull may connect: anywhere for a build the operator
        /// started on the host, public addresses (and the networks of
        /// `[node] image_registry_private_allow`) for one asked for through
        /// the API (`NodeConfig::api_image_reach`). Not part of the cache
        /// key: the image's digest is.
        #[serde(skip)]
        reach: siesta_image::Reach,
    },
}

/// One build step, in the order the user gave them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Step {
    /// A shell command (`bash -l -c`); as `user` when given, else as the
    /// current user. A non-zero exit fails the build.
    Run {
        command: String,
        user: Option<String>,
    },
    /// Copies what `sources` (paths or globs relative to the archive's
    /// root, which is the build context) match in a tar archive (gzip or
    /// plain) to `dest`, as Docker's COPY does; relative `dest` is under the
    /// working directory.
    Copy {
        archive: PathBuf,
        sources: Vec<String>,
        /// The archive's SHA-256: what the cache key covers.
        digest: String,
        dest: String,
        /// `user[:group]` to own what is unpacked (the current user if
        /// `None`).
        owner: Option<String>,
        /// Octal mode for every unpacked entry.
        mode: Option<u32>,
    },
    /// Environment for later steps and for the template's sandboxes.
    Env(Vec<(String, String)>),
    /// Working directory for later steps and the sandboxes (created).
    Workdir(String),
    /// User for later steps and the sandboxes (created when missing).
    User(String),
}

impl Step {
    /// What the caches key this step by: all it says, with a COPY's files
    /// counted by their digest rather than where their archive lies.
    fn cache_value(&self) -> serde_json::Value {
        match self {
            Step::Copy {
                digest,
                sources,
                dest,
                owner,
                mode,
                ..
            } => serde_json::json!(["COPY", digest, sources, dest, owner, mode]),
            other => serde_json::to_value(other).unwrap_or_default(),
        }
    }

    /// Whether the step can change the disk (ENV only changes what later
    /// steps get).
    pub fn writes_disk(&self) -> bool {
        !matches!(self, Step::Env(_))
    }

    /// A short, one-line description for build logs.
    pub fn describe(&self) -> String {
        match self {
            Step::Run { command, user } => match user {
                Some(u) => format!("RUN (as {u}) {command}"),
                None => format!("RUN {command}"),
            },
            Step::Copy { sources, dest, .. } => format!("COPY {} {dest}", sources.join(" ")),
            Step::Env(pairs) => {
                let names: Vec<&str> = pairs.iter().map(|(k, _)| k.as_str()).collect();
                format!("ENV {}", names.join(" "))
            }
            Step::Workdir(dir) => format!("WORKDIR {dir}"),
            Step::User(user) => format!("USER {user}"),
        }
    }
}

/// A complete build: its name, source, steps and what makes it ready.
#[derive(Debug, Clone, Serialize)]
pub struct StepsBuild {
    pub name: String,
    pub source: BuildSource,
    pub steps: Vec<Step>,
    /// Started in the background after the steps; the template is frozen
    /// with it running.
    pub start_cmd: Option<String>,
    /// Run until it exits 0 before freezing (after the start command).
    pub ready_cmd: Option<String>,
    /// vCPUs and memory of the template's VM; the node's defaults if `None`.
    pub vcpus: Option<u32>,
    pub memory_mib: Option<u32>,
    /// Size of the template's disk in MiB; for an image, what its files
    /// take plus [`crate::DEFAULT_FREE_MIB`] if `None`; for a template, its
    /// disk grown to this size.
    pub disk_mib: Option<u32>,
    /// Free space the disk keeps at least (E2B's `minFreeDiskMb`): an
    /// image's disk gets this instead of the default free space; a
    /// template's disk grows when it has less.
    pub min_free_disk_mib: Option<u32>,
    /// Where the caches stop being used (E2B's `force`, the CLI's
    /// `--force`): `None` uses them throughout; `Some(0)` builds everything
    /// again, the base disk too; `Some(n)` reuses what steps before step
    /// `n` (counted from 1) left and runs step `n` and those after it.
    #[serde(skip)]
    pub rebuild_from: Option<usize>,
}

impl StepsBuild {
    /// The cache key: a digest over the source snapshot `source_id` and
    /// everything the build reads. Copied files count by their digest, not
    /// by where the archive happens to lie.
    pub fn cache_key(&self, source_id: &str) -> String {
        #[derive(Serialize)]
        struct Keyed<'a> {
            source_id: &'a str,
            steps: Vec<serde_json::Value>,
            start_cmd: &'a Option<String>,
            ready_cmd: &'a Option<String>,
            vcpus: Option<u32>,
            memory_mib: Option<u32>,
            disk_mib: Option<u32>,
            min_free_disk_mib: Option<u32>,
        }
        let steps = self.steps.iter().map(Step::cache_value).collect();
        let keyed = Keyed {
            source_id,
            steps,
            start_cmd: &self.start_cmd,
            ready_cmd: &self.ready_cmd,
            vcpus: self.vcpus,
            memory_mib: self.memory_mib,
            disk_mib: self.disk_mib,
            min_free_disk_mib: self.min_free_disk_mib,
        };
        digest(&keyed)
    }

    /// The key of the base disk in the step cache: the source and what
    /// sizes the disk.
    pub fn base_key(&self, source_id: &str) -> String {
        digest(&serde_json::json!([
            "base",
            source_id,
            self.disk_mib,
            self.min_free_disk_mib
        ]))
    }

    /// Whether the step cache may be used for step `n` (counted from 1;
    /// 0 is the base disk).
    pub fn may_reuse(&self, n: usize) -> bool {
        self.rebuild_from.is_none_or(|from| n < from)
    }
}

/// The key in the step cache of what `step` leaves when it runs on what
/// the step (or base) with key `parent` left.
pub fn step_key(parent: &str, step: &Step) -> String {
    digest(&serde_json::json!([parent, step.cache_value()]))
}

fn digest(value: &impl Serialize) -> String {
    let bytes = serde_json::to_vec(value).unwrap_or_default();
    hex::encode(Sha256::digest(bytes))
}

/// The state the steps build up as they run: the user, directory and
/// environment the next step gets, and at the end, the template's defaults.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct StepContext {
    pub user: String,
    pub workdir: String,
    pub env: BTreeMap<String, String>,
}

impl StepContext {
    /// E2B's starting point: user `user` in `/home/user`, with the source
    /// template's environment.
    pub fn starting(
        env: BTreeMap<String, String>,
        guest: &siesta_envd_client::GuestDefaults,
    ) -> Self {
        Self {
            user: guest.user.clone(),
            workdir: guest.workdir.clone(),
            env,
        }
    }

    /// `path` resolved against the working directory.
    pub fn resolve(&self, path: &str) -> String {
        if path.starts_with('/') {
            path.to_string()
        } else {
            format!("{}/{}", self.workdir.trim_end_matches('/'), path)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build(steps: Vec<Step>) -> StepsBuild {
        StepsBuild {
            name: "t".into(),
            source: BuildSource::Template("base".into()),
            steps,
            start_cmd: None,
            ready_cmd: None,
            vcpus: None,
            memory_mib: None,
            disk_mib: None,
            min_free_disk_mib: None,
            rebuild_from: None,
        }
    }

    fn copy(archive: &str, digest: &str) -> Step {
        Step::Copy {
            archive: archive.into(),
            sources: vec!["app".into()],
            digest: digest.into(),
            dest: "/app".into(),
            owner: None,
            mode: None,
        }
    }

    #[test]
    fn cache_key_covers_steps_and_source_but_not_archive_paths() {
        let run = |c: &str| Step::Run {
            command: c.into(),
            user: None,
        };
        let a = build(vec![run("echo a")]);
        assert_eq!(
            a.cache_key("s1"),
            build(vec![run("echo a")]).cache_key("s1")
        );
        assert_ne!(a.cache_key("s1"), a.cache_key("s2"));
        assert_ne!(
            a.cache_key("s1"),
            build(vec![run("echo b")]).cache_key("s1")
        );
        let x = build(vec![copy("/tmp/x.tar", "d1")]);
        assert_eq!(
            x.cache_key("s"),
            build(vec![copy("/other/y.tar", "d1")]).cache_key("s")
        );
        assert_ne!(
            x.cache_key("s"),
            build(vec![copy("/tmp/x.tar", "d2")]).cache_key("s")
        );
        let mut started = build(vec![run("echo a")]);
        started.start_cmd = Some("server".into());
        assert_ne!(started.cache_key("s1"), a.cache_key("s1"));
    }

    #[test]
    fn step_keys_chain_and_rebuild_from_limits_reuse() {
        let run = |c: &str| Step::Run {
            command: c.into(),
            user: None,
        };
        let b = build(vec![run("a"), run("b")]);
        let base = b.base_key("s1");
        assert_ne!(base, b.base_key("s2"));
        let mut sized = b.clone();
        sized.disk_mib = Some(4096);
        assert_ne!(base, sized.base_key("s1"));
        let one = step_key(&base, &run("a"));
        assert_eq!(one, step_key(&base, &run("a")));
        assert_ne!(step_key(&one, &run("b")), step_key(&base, &run("b")));
        assert!(b.may_reuse(0) && b.may_reuse(2));
        let mut forced = b.clone();
        forced.rebuild_from = Some(2);
        assert!(forced.may_reuse(1) && !forced.may_reuse(2));
        forced.rebuild_from = Some(0);
        assert!(!forced.may_reuse(0));
    }

    #[test]
    fn relative_paths_resolve_against_the_workdir() {
        let ctx = StepContext::starting(BTreeMap::new(), &Default::default());
        assert_eq!(ctx.resolve("app"), "/home/user/app");
        assert_eq!(ctx.resolve("/srv"), "/srv");
    }
}
