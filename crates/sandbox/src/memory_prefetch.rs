//! The `memory_prefetch` stage: start reading a template's startup manifest
//! pages into the page cache when a resume begins, and account for it when
//! the guest is ready.
//!
//! It never fails or delays a resume: a template without manifest, a
//! manifest that is missing, corrupt or for another memory size, or a
//! memory file that cannot be opened gives a warning and plain on-demand
//! paging.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use siesta_snapshot::prefetch::PrefetchConfig;
use siesta_snapshot::{Manifest, PrefetchHandle, Prefetcher, Repository};

use crate::stages::{BackgroundTiming, Stage, StageClock};
use siesta_template::Template;

/// The node's prefetcher and its switch.
pub struct MemoryPrefetch {
    prefetcher: Prefetcher,
    enabled: AtomicBool,
    /// Validated manifests by snapshot id and digest, so a resume reads and
    /// hashes a manifest only the first time.
    cache: Mutex<HashMap<(String, String), Arc<Manifest>>>,
}

impl MemoryPrefetch {
    pub fn new(enabled: bool) -> Self {
        Self::with_config(enabled, PrefetchConfig::default())
    }

    pub fn with_config(enabled: bool, config: PrefetchConfig) -> Self {
        Self {
            prefetcher: Prefetcher::new(config),
            enabled: AtomicBool::new(enabled),
            cache: Mutex::new(HashMap::new()),
        }
    }

    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::SeqCst)
    }

    /// Turns prefetching on or off for resumes that start afterwards
    /// (benchmarks compare both in one process).
    pub fn set_enabled(&self, on: bool) {
        self.enabled.store(on, Ordering::SeqCst);
    }

    /// Starts (or joins) the prefetch of `template`'s manifest; `None` when
    /// off or when there is nothing valid to prefetch.
    pub fn start(&self, repo: &std::path::Path, template: &Template) -> Option<PrefetchHandle> {
        if !self.enabled() || template.lazy {
            // A lazily served template's fill fetches the manifest's
            // chunks first by itself.
            return None;
        }
        let record = template.snapshot.as_ref()?;
        let desc = record.manifest.as_ref()?;
        let key = (record.id.clone(), desc.sha256.clone());
        let cached = self.cache.lock().ok().and_then(|c| c.get(&key).cloned());
        let manifest = match cached {
            Some(m) => m,
            None => {
                let loaded = Repository::open(repo).and_then(|r| r.load_manifest(record));
                match loaded {
                    Ok(Some(m)) => {
                        let m = Arc::new(m);
                        if let Ok(mut c) = self.cache.lock() {
                            c.insert(key, Arc::clone(&m));
                        }
                        m
                    }
                    Ok(None) => return None,
                    Err(e) => {
                        tracing::warn!(
                            template = %template.record.name,
                            "startup manifest unusable, resuming with on-demand paging: {e}"
                        );
                        return None;
                    }
                }
            }
        };
        match self
            .prefetcher
            .start(&template.memory, manifest, &desc.sha256)
        {
            Ok(h) => Some(h),
            Err(e) => {
                tracing::warn!(
                    template = %template.record.name,
                    memory = %template.memory.display(),
                    "cannot prefetch memory file, resuming with on-demand paging: {e}"
                );
                None
            }
        }
    }
}

/// Records how the prefetch went when the guest became ready, then lets go
/// of it: if no other resume shares it, unfinished reads are cancelled.
pub fn finish_at_ready(clock: &mut StageClock, handle: Option<PrefetchHandle>) {
    let Some(handle) = handle else {
        return;
    };
    let timing = match handle.outcome() {
        Some(o) => BackgroundTiming {
            stage: Stage::MemoryPrefetch,
            ms: o.elapsed.as_secs_f64() * 1e3,
            finished_before_ready: o.completed,
            bytes: o.bytes,
        },
        None => BackgroundTiming {
            stage: Stage::MemoryPrefetch,
            ms: handle.running_for().as_secs_f64() * 1e3,
            finished_before_ready: false,
            bytes: 0,
        },
    };
    clock.record_background(timing);
}

#[cfg(test)]
mod tests {
    use super::*;
    use siesta_snapshot::record::{FileLocation, FileRef, SnapshotKind, SnapshotRecord};
    use siesta_template::record::{FileRecord, TemplateRecord};

    const MEM: u64 = 32 * 4096;

    /// A template whose snapshot record lives in `repo` with a manifest.
    fn template(repo: &Repository, dir: &std::path::Path) -> Template {
        let memory = dir.join("memory.img");
        std::fs::write(&memory, vec![1u8; MEM as usize]).unwrap();
        let file = |name: &str| FileRecord {
            name: name.into(),
            size: 0,
            allocated: 0,
            sha256: String::new(),
        };
        let record = TemplateRecord {
            name: "t".into(),
            image: "tiny".into(),
            created_at: chrono::Utc::now(),
            vcpus: 1,
            memory_mib: 1,
            vmm: siesta_vmm::VmmInfo {
                kind: "qemu".into(),
                version: "test".into(),
                machine: "q35".into(),
                accel: siesta_vmm::Accel::Tcg,
                devices: siesta_vmm::DEVICE_SET,
            },
            kernel: String::new(),
            kernel_cmdline: String::new(),
            memory: file("memory.img"),
            state: file("state.bin"),
            disk: file("disk.img"),
            cold_boot_ms: 0.0,
            defaults: Default::default(),
            parent: None,
            build_key: None,
            source_image: None,
            guest_assets: None,
        };
        let state = dir.join("state.bin");
        std::fs::write(&state, b"s").unwrap();
        let snap = repo
            .publish(siesta_snapshot::repo::PublishRequest {
                id: "tpl-t".into(),
                kind: SnapshotKind::Template,
                parent: None,
                guest_memory_size: MEM,
                files: vec![siesta_snapshot::repo::PublishFile {
                    role: "state".into(),
                    source: state.clone(),
                    placement: siesta_snapshot::repo::Placement::LocalCopy,
                    sha256: None,
                }],
                existing: vec![(
                    "memory".into(),
                    FileRef {
                        location: FileLocation::Local {
                            name: "unused".into(),
                        },
                        size: MEM,
                        content_sha256: None,
                    },
                )],
                aliases: vec![],
                meta: serde_json::Value::Null,
            })
            .unwrap();
        let m = Manifest::from_touch_order(4096, MEM, &[4, 5, 1]);
        let snap: SnapshotRecord = repo.attach_manifest("tpl-t", snap.generation, &m).unwrap();
        Template {
            dir: repo.snapshot_dir("tpl-t"),
            record,
            memory,
            state,
            disk: dir.join("disk.img"),
            snapshot: Some(snap),
            lazy: false,
        }
    }

    #[tokio::test]
    async fn valid_manifest_prefetches_and_corrupt_one_falls_back() {
        let tmp = tempfile::tempdir().unwrap();
        let repo = Repository::open(tmp.path().join("repo")).unwrap();
        let t = template(&repo, tmp.path());
        let off = MemoryPrefetch::new(false);
        assert!(off.start(repo.root(), &t).is_none(), "switched off");

        let on = MemoryPrefetch::new(true);
        let h = on
            .start(repo.root(), &t)
            .expect("valid manifest prefetches");
        let out = h.wait().await;
        assert!(out.completed);
        assert_eq!(out.bytes, 3 * 4096);
        let mut clock = StageClock::start();
        finish_at_ready(&mut clock, Some(h));
        let timings = clock.finish();
        let bg = timings.background(Stage::MemoryPrefetch).unwrap();
        assert!(bg.finished_before_ready);

        // Corrupt on disk: a fresh node (no cached manifest) falls back.
        let path = repo.snapshot_dir("tpl-t").join("startup.manifest");
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0x10;
        std::fs::write(&path, bytes).unwrap();
        let fresh = MemoryPrefetch::new(true);
        assert!(
            fresh.start(repo.root(), &t).is_none(),
            "corrupt: on-demand paging"
        );
        // Missing: the same.
        std::fs::remove_file(&path).unwrap();
        assert!(fresh.start(repo.root(), &t).is_none());
        // A template without repository record (legacy directory) too.
        let legacy = Template {
            snapshot: None,
            ..t
        };
        assert!(fresh.start(repo.root(), &legacy).is_none());
    }
}
