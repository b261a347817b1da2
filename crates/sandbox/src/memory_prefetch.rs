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
use crate::template::Template;

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
        Self {
            prefetcher: Prefetcher::new(PrefetchConfig::default()),
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
        if !self.enabled() {
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
