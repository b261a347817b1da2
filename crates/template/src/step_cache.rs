//! The step cache: the disk as each step of a template build left it, so a
//! later build that shares a prefix of steps (the same source, the same
//! steps in the same order) starts after that prefix instead of running it
//! again, as Docker's layer cache does.
//!
//! A *layer* is a disk image in `$SIESTA_HOME/cache/steps/` and a small JSON
//! entry named by its key: the base disk (raw) under the base's key, then
//! for each step a qcow2 overlay holding only that step's writes, backed by
//! its parent's image. The build VM writes into a fresh overlay; after a
//! step the guest flushes its caches and the VMM's disk checkpoint freezes
//! that overlay, which becomes the step's layer. A step that cannot write
//! the disk (ENV) shares its parent's image. The entry also keeps the step
//! context (user, directory, environment) the next step starts from.
//!
//! Entries are written atomically (temp file, rename) after their image is
//! frozen, so a crashed build leaves at most an image nobody names, which
//! [`StepCache::prune`] removes once its writer's process is gone. Images
//! are never changed once named; an entry whose image or backing image is
//! missing or has another size is not used. The cache is bounded
//! (`SIESTA_STEP_CACHE_MIB`): the least recently used entries, and whatever
//! is built on them, go first.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use siesta_vmm::DiskFormat;

use crate::error::{IoContext, Result};
use crate::steps::StepContext;

/// One cached layer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Layer {
    pub key: String,
    /// The image's file name in the cache directory.
    pub disk: String,
    pub format: DiskFormat,
    /// The image's size when it was frozen.
    pub size: u64,
    /// The images below `disk`, nearest first (a qcow2 layer's parent
    /// image, its parent's...). The VM is given this chain; the names in
    /// the images' headers are never followed, since the VM that wrote a
    /// layer could have rewritten them (`siesta_vmm::disk_image`).
    #[serde(default)]
    pub below: Vec<CachedImage>,
    /// What the next step starts from.
    pub context: StepContext,
}

/// An image in the cache directory and the driver that reads it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct CachedImage {
    pub file: String,
    pub format: DiskFormat,
}

impl Layer {
    /// The image `disk` is backed by.
    pub fn backing(&self) -> Option<&str> {
        self.below.first().map(|i| i.file.as_str())
    }

    /// This layer's image over the images below it: what an overlay on
    /// this layer is backed by.
    pub fn chain(&self) -> Vec<CachedImage> {
        let top = CachedImage {
            file: self.disk.clone(),
            format: self.format,
        };
        std::iter::once(top)
            .chain(self.below.iter().cloned())
            .collect()
    }
}

/// The step cache directory of one node.
#[derive(Debug, Clone)]
pub(crate) struct StepCache {
    dir: PathBuf,
}

impl StepCache {
    pub fn open(dir: PathBuf) -> Result<Self> {
        std::fs::create_dir_all(&dir).ctx("creating the step cache", &dir)?;
        Ok(Self { dir })
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    /// The layer under `key`, if it is whole: its images are there with the
    /// size recorded. Marks it used (for [`StepCache::prune`]).
    pub fn get(&self, key: &str) -> Option<Layer> {
        let entry = self.entry_path(key);
        let layer: Layer = serde_json::from_slice(&std::fs::read(&entry).ok()?).ok()?;
        let size = std::fs::metadata(self.path(&layer.disk)).ok()?.len();
        let below_there = layer.below.iter().all(|i| self.path(&i.file).is_file());
        // A qcow2 layer always has a parent; without one recorded the
        // entry is from before chains were (its image would open alone).
        let chained = layer.format == DiskFormat::Raw || !layer.below.is_empty();
        if layer.key != key || size != layer.size || !below_there || !chained {
            tracing::warn!(key, "step cache entry is incomplete: not used");
            return None;
        }
        let _ = std::fs::File::options()
            .write(true)
            .open(&entry)
            .and_then(|f| f.set_modified(SystemTime::now()));
        Some(layer)
    }

    /// A new, unused path for an image of `key`: the name carries this
    /// process's id so that [`StepCache::prune`] can tell an image being
    /// written from one a dead build left.
    pub fn new_image(&self, key: &str, format: DiskFormat) -> PathBuf {
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let ext = match format {
            DiskFormat::Raw => "raw",
            DiskFormat::Qcow2 => "qcow2",
        };
        let short = &key[..key.len().min(16)];
        self.path(&format!("{short}-{}-{nanos}.{ext}", std::process::id()))
    }

    /// Names the frozen image `disk` (a file in this cache, over the
    /// images `below`) as the layer `key`.
    pub fn put(
        &self,
        key: &str,
        disk: &Path,
        format: DiskFormat,
        below: Vec<CachedImage>,
        context: &StepContext,
    ) -> Result<Layer> {
        let name = |p: &Path| p.file_name().map(|n| n.to_string_lossy().into_owned());
        let layer = Layer {
            key: key.to_string(),
            disk: name(disk).unwrap_or_default(),
            format,
            size: std::fs::metadata(disk)
                .ctx("reading the size of", disk)?
                .len(),
            below,
            context: context.clone(),
        };
        let entry = self.entry_path(key);
        let tmp = entry.with_extension(format!("json.tmp-{}", std::process::id()));
        let bytes = serde_json::to_vec_pretty(&layer).unwrap_or_default();
        std::fs::write(&tmp, bytes).ctx("writing step cache entry", &tmp)?;
        std::fs::rename(&tmp, &entry).ctx("publishing step cache entry", &entry)?;
        Ok(layer)
    }

    /// Removes the least recently used entries (and the entries built on
    /// them) until the images take at most `max_bytes`, and images no entry
    /// names whose writer is gone. Returns the bytes freed.
    pub fn prune(&self, max_bytes: u64) -> Result<u64> {
        let mut entries = self.entries()?;
        let mut freed = self.remove_unnamed(&entries)?;
        while self.total_bytes()? > max_bytes && !entries.is_empty() {
            let oldest = entries
                .iter()
                .enumerate()
                .min_by_key(|(_, (_, used))| *used)
                .map_or(0, |(i, _)| i);
            let (layer, _) = entries.swap_remove(oldest);
            freed += self.evict(&mut entries, layer);
        }
        Ok(freed)
    }

    /// Removes `layer`'s entry, its image when no entry in `kept` shares
    /// it, and, transitively, the entries built on a removed image.
    fn evict(&self, kept: &mut Vec<(Layer, SystemTime)>, layer: Layer) -> u64 {
        let mut freed = 0;
        let mut doomed = vec![layer];
        while let Some(layer) = doomed.pop() {
            let _ = std::fs::remove_file(self.entry_path(&layer.key));
            if kept.iter().any(|(l, _)| l.disk == layer.disk) {
                continue;
            }
            let image = self.path(&layer.disk);
            freed += std::fs::metadata(&image).map_or(0, |m| m.len());
            let _ = std::fs::remove_file(&image);
            let (broken, rest): (Vec<_>, Vec<_>) = std::mem::take(kept)
                .into_iter()
                .partition(|(l, _)| l.backing() == Some(layer.disk.as_str()));
            *kept = rest;
            doomed.extend(broken.into_iter().map(|(l, _)| l));
        }
        freed
    }

    fn entry_path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.json"))
    }

    /// Every readable entry with when it was last used.
    fn entries(&self) -> Result<Vec<(Layer, SystemTime)>> {
        let mut out = Vec::new();
        for item in std::fs::read_dir(&self.dir).ctx("listing the step cache", &self.dir)? {
            let Ok(item) = item else { continue };
            let path = item.path();
            if path.extension().is_none_or(|e| e != "json") {
                continue;
            }
            let layer = std::fs::read(&path)
                .ok()
                .and_then(|b| serde_json::from_slice::<Layer>(&b).ok());
            let used = item.metadata().and_then(|m| m.modified());
            match (layer, used) {
                (Some(layer), Ok(used)) => out.push((layer, used)),
                _ => drop(std::fs::remove_file(&path)),
            }
        }
        Ok(out)
    }

    /// Deletes images no entry names or builds on, unless the process that
    /// writes them still runs.
    fn remove_unnamed(&self, entries: &[(Layer, SystemTime)]) -> Result<u64> {
        let named: HashSet<&str> = entries
            .iter()
            .flat_map(|(l, _)| std::iter::once(l.disk.as_str()).chain(l.backing()))
            .collect();
        let mut freed = 0;
        for item in std::fs::read_dir(&self.dir).ctx("listing the step cache", &self.dir)? {
            let Ok(item) = item else { continue };
            let name = item.file_name().to_string_lossy().into_owned();
            if name.ends_with(".json") || named.contains(name.as_str()) {
                continue;
            }
            if writer_pid(&name).is_some_and(|pid| Path::new(&format!("/proc/{pid}")).exists()) {
                continue;
            }
            freed += item.metadata().map_or(0, |m| m.len());
            let _ = std::fs::remove_file(item.path());
        }
        Ok(freed)
    }

    /// Bytes the cache's files take on disk (sparse images count what they
    /// use).
    fn total_bytes(&self) -> Result<u64> {
        use std::os::unix::fs::MetadataExt;
        let mut total = 0;
        for item in std::fs::read_dir(&self.dir).ctx("listing the step cache", &self.dir)? {
            if let Ok(meta) = item.and_then(|i| i.metadata()) {
                total += meta.blocks() * 512;
            }
        }
        Ok(total)
    }
}

/// The writer's process id in an image name (`<key>-<pid>-<nanos>.<ext>`)
/// or a temp entry (`<key>.json.tmp-<pid>`).
fn writer_pid(name: &str) -> Option<u32> {
    if let Some((_, pid)) = name.rsplit_once(".json.tmp-") {
        return pid.parse().ok();
    }
    let stem = name.rsplit_once('.')?.0;
    let mut parts = stem.rsplit('-');
    let _nanos = parts.next()?;
    parts.next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(user: &str) -> StepContext {
        StepContext {
            user: user.into(),
            workdir: "/".into(),
            env: Default::default(),
        }
    }

    fn image(cache: &StepCache, key: &str, bytes: usize) -> PathBuf {
        let p = cache.new_image(key, DiskFormat::Qcow2);
        std::fs::write(&p, vec![1u8; bytes]).unwrap();
        p
    }

    #[test]
    fn a_layer_round_trips_and_an_incomplete_one_is_not_used() {
        let dir = tempfile::tempdir().unwrap();
        let cache = StepCache::open(dir.path().join("steps")).unwrap();
        let base = image(&cache, "b", 10);
        let got = cache
            .put("b", &base, DiskFormat::Raw, vec![], &ctx("user"))
            .unwrap();
        assert_eq!(cache.get("b"), Some(got.clone()));
        assert_eq!(cache.get("other"), None);
        let step = image(&cache, "s", 5);
        let s = cache
            .put("s", &step, DiskFormat::Qcow2, got.chain(), &ctx("app"))
            .unwrap();
        assert_eq!(cache.get("s").unwrap().context.user, "app");
        assert_eq!(s.backing(), Some(got.disk.as_str()));
        assert_eq!(s.chain().len(), 2);
        assert_eq!(s.chain()[1].format, DiskFormat::Raw);
        // A qcow2 entry written before chains were recorded is not used.
        cache
            .put("unchained", &step, DiskFormat::Qcow2, vec![], &ctx("app"))
            .unwrap();
        assert_eq!(cache.get("unchained"), None);
        // A changed image, or a missing backing image, is not used.
        std::fs::write(&step, b"x").unwrap();
        assert_eq!(cache.get("s"), None);
        std::fs::remove_file(&base).unwrap();
        assert_eq!(cache.get("b"), None);
    }

    #[test]
    fn prune_drops_the_oldest_and_what_is_built_on_it() {
        let dir = tempfile::tempdir().unwrap();
        let cache = StepCache::open(dir.path().join("steps")).unwrap();
        let old = image(&cache, "old", 64 << 10);
        let old_layer = cache
            .put("old", &old, DiskFormat::Raw, vec![], &ctx("u"))
            .unwrap();
        let child = image(&cache, "child", 8 << 10);
        cache
            .put(
                "child",
                &child,
                DiskFormat::Qcow2,
                old_layer.chain(),
                &ctx("u"),
            )
            .unwrap();
        // An ENV step shares its parent's image.
        cache
            .put(
                "env",
                &child,
                DiskFormat::Qcow2,
                old_layer.chain(),
                &ctx("u"),
            )
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let new = image(&cache, "new", 64 << 10);
        cache
            .put("new", &new, DiskFormat::Raw, vec![], &ctx("u"))
            .unwrap();
        // An image no entry names, from a process that is gone.
        let stray = cache.path("ffff-999999999-1.qcow2");
        std::fs::write(&stray, b"stray").unwrap();
        // One that this (running) process is still writing.
        let busy = image(&cache, "busy", 10);

        let freed = cache.prune(100 << 10).unwrap();
        assert!(freed >= 64 << 10, "freed {freed}");
        assert_eq!(cache.get("old"), None);
        assert_eq!(cache.get("child"), None);
        assert_eq!(cache.get("env"), None);
        assert!(cache.get("new").is_some());
        assert!(!stray.exists() && !old.exists() && !child.exists());
        assert!(busy.exists());
    }

    #[test]
    fn writer_pids_come_from_the_names() {
        assert_eq!(writer_pid("abcd-42-123.qcow2"), Some(42));
        assert_eq!(writer_pid("abcd.json.tmp-7"), Some(7));
        assert_eq!(writer_pid("abcd.json"), None);
    }
}
