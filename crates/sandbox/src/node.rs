//! The node as sandboxes see it: the [`Host`] (VMM backend, network slots,
//! configuration, blob checks, from `siesta-host`) plus what only running
//! sandboxes need: the startup-manifest prefetch and the announcements of
//! sandboxes whose VM stopped. Built once at start-up and passed
//! explicitly to everything that needs it.

use std::sync::Arc;

use siesta_host::{Host, Tuning};

use crate::config::NodeConfig;
use crate::error::Result;

pub struct Node {
    host: Host,
    /// Startup-manifest prefetch, shared by every resume on this node.
    pub prefetch: crate::memory_prefetch::MemoryPrefetch,
    /// Announces the id of each sandbox whose VM stopped (pause, kill,
    /// death), once its row says so, so whoever streams to it (the front
    /// door) can end at once instead of waiting on a guest that will never
    /// answer, and a client that then asks after it gets the truth.
    stopped: tokio::sync::broadcast::Sender<String>,
}

/// A node is its host and more: `node.config`, `node.vmm` and the slot
/// methods are the host's, and a `&Node` is taken wherever a `&Host` is
/// (template builds).
impl std::ops::Deref for Node {
    type Target = Host;

    fn deref(&self) -> &Host {
        &self.host
    }
}

impl Node {
    /// Starts the node: the host (accelerator, network leftovers of a
    /// crashed run of the same tag removed, slot pool warmed), then the
    /// prefetch.
    pub async fn start(config: NodeConfig) -> Result<Arc<Self>> {
        Self::start_tuned(config, Tuning::default()).await
    }

    /// [`Node::start`] with some optimisations off, for a benchmark to
    /// compare (see [`Tuning`]).
    pub async fn start_tuned(config: NodeConfig, tuning: Tuning) -> Result<Arc<Self>> {
        let host = Host::start_tuned(config, tuning).await?;
        let prefetch = crate::memory_prefetch::MemoryPrefetch::with_config(
            host.config.prefetch,
            siesta_snapshot::prefetch::PrefetchConfig {
                pad_bytes: host.config.prefetch_pad_kib << 10,
                ..Default::default()
            },
        );
        Ok(Arc::new(Self {
            host,
            prefetch,
            stopped: tokio::sync::broadcast::channel(256).0,
        }))
    }

    /// Refuses a template whose memory or disk does not match its digests
    /// (hashed on first use and after a change; see
    /// `siesta_host::blob_checks`).
    pub async fn check_template(&self, template: &siesta_template::Template) -> Result<()> {
        if template.lazy {
            // Every chunk is checked against its SHA-256 as it arrives, the
            // whole files once the fill ends; hashing here would fetch all
            // of it before the resume.
            return Ok(());
        }
        let checks = self.blob_checks.clone();
        let template = template.clone();
        siesta_host::blocking::run("checking a template's files", move || {
            checks.check(&[
                (&template.memory, &template.record.memory.sha256),
                (&template.disk, &template.record.disk.sha256),
            ])
        })
        .await?;
        Ok(())
    }

    /// Ids of sandboxes whose VM stopped, from now on.
    pub fn subscribe_stopped(&self) -> tokio::sync::broadcast::Receiver<String> {
        self.stopped.subscribe()
    }

    pub(crate) fn announce_stopped(&self, id: &str) {
        // No receiver is fine: nothing streams to it.
        let _ = self.stopped.send(id.to_string());
    }
}
