//! A pool of ready slots: created ahead of time, handed out, taken back.

use std::collections::BTreeSet;
use std::sync::{Arc, Weak};

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio::sync::{Mutex, RwLock};

use crate::boundary::Boundary;
use crate::egress::Resolver;
use crate::error::{NetError, Result};
use crate::host;
use crate::layout::{check_capacity, SlotLayout, Subnet, Tag, DEFAULT_TAG};
use crate::slot::{destroy, GuestLink, Slot};

/// Pool configuration.
#[derive(Clone, Debug)]
pub struct NetConfig {
    /// Short instance tag (1..=6 lowercase letters); every name this pool
    /// creates or deletes is derived from it.
    pub tag: String,
    /// Network the slot /30s are carved from.
    pub subnet: Subnet,
    /// Most slots in existence at once (warm + in use).
    pub capacity: usize,
    /// Slots kept ready for `acquire`.
    pub warm: usize,
    /// `Tap` in production; `Veth` only for tests without a VMM.
    pub guest_link: GuestLink,
    /// The name server the egress proxy resolves allowed domains with
    /// (`None`: the host's resolver).
    pub egress_dns: Option<std::net::SocketAddr>,
    /// What guests never reach, less the private networks the operator
    /// opened (the root table and the egress proxy enforce it).
    pub boundary: Boundary,
}

impl Default for NetConfig {
    fn default() -> Self {
        Self {
            tag: DEFAULT_TAG.to_owned(),
            subnet: Subnet::default(),
            capacity: 1024,
            warm: 4,
            guest_link: GuestLink::Tap,
            egress_dns: None,
            boundary: Boundary::default(),
        }
    }
}

/// Counters for observability and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    pub warm: usize,
    /// Slots that exist or are being created (warm, handed out, in flight).
    pub allocated: usize,
    pub created: u64,
    pub destroyed: u64,
    pub reused: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    New,
    Running,
    ShutDown,
}

struct State {
    phase: Phase,
    warm: Vec<Slot>,
    /// Indices that exist or are being created.
    allocated: BTreeSet<usize>,
    /// Background creations in flight, counted against the warm target.
    refilling: usize,
    stats: PoolStats,
    /// Taken by `start`, which spawns the task that destroys slots dropped
    /// without release.
    orphans: Option<UnboundedReceiver<usize>>,
}

struct Shared {
    tag: Tag,
    subnet: Subnet,
    capacity: usize,
    warm_target: usize,
    guest_link: GuestLink,
    resolver: Arc<Resolver>,
    boundary: Arc<Boundary>,
    state: Mutex<State>,
    /// Held shared by every slot creation, exclusively by shutdown, so that
    /// shutdown never races a half-built slot.
    gate: RwLock<()>,
    /// Handed to every slot handed out (see [`Slot`]'s lease).
    orphans: UnboundedSender<usize>,
}

/// Concurrency-safe pool of network slots; cheap to clone.
#[derive(Clone)]
pub struct SlotPool {
    shared: Arc<Shared>,
}

impl SlotPool {
    pub fn new(config: NetConfig) -> Result<Self> {
        let tag = Tag::new(&config.tag)?;
        check_capacity(&tag, &config.subnet, config.capacity)?;
        if config.warm > config.capacity {
            return Err(NetError::Config(format!(
                "warm {} exceeds capacity {}",
                config.warm, config.capacity
            )));
        }
        let (orphans, orphans_rx) = unbounded_channel();
        Ok(Self {
            shared: Arc::new(Shared {
                tag,
                subnet: config.subnet,
                capacity: config.capacity,
                warm_target: config.warm,
                guest_link: config.guest_link,
                resolver: Arc::new(Resolver::new(config.egress_dns)),
                boundary: Arc::new(config.boundary),
                state: Mutex::new(State {
                    phase: Phase::New,
                    warm: Vec::new(),
                    allocated: BTreeSet::new(),
                    refilling: 0,
                    stats: PoolStats::default(),
                    orphans: Some(orphans_rx),
                }),
                gate: RwLock::new(()),
                orphans,
            }),
        })
    }

    pub fn tag(&self) -> &Tag {
        &self.shared.tag
    }

    /// Layout of slot `index` under this pool's tag and subnet.
    pub fn layout(&self, index: usize) -> Result<SlotLayout> {
        SlotLayout::new(&self.shared.tag, &self.shared.subnet, index)
    }

    /// Removes this tag's leftovers from a crashed run, installs the root
    /// table, then creates the warm slots.
    pub async fn start(&self) -> Result<()> {
        let sh = &self.shared;
        {
            let mut st = sh.state.lock().await;
            if st.phase != Phase::New {
                return Err(self.state_err("start called twice"));
            }
            st.phase = Phase::Running;
            if let Some(rx) = st.orphans.take() {
                tokio::spawn(reap_orphans(Arc::downgrade(sh), rx));
            }
        }
        host::cleanup_leftovers(&sh.tag).await?;
        host::check_subnet_free(&sh.tag, &sh.subnet).await?;
        let egress = host::setup_root(&sh.tag, &sh.subnet, &sh.boundary).await?;
        tracing::info!(tag = %sh.tag, subnet = %sh.subnet, ?egress, "network pool starting");
        for _ in 0..sh.warm_target {
            let slot = self.create_reserved().await?;
            let mut st = sh.state.lock().await;
            st.warm.push(slot);
            st.stats.warm = st.warm.len();
        }
        Ok(())
    }

    /// A ready slot: a warm one, or one created now if none is warm.
    /// Refills the warm set in the background.
    pub async fn acquire(&self) -> Result<Slot> {
        let warm = {
            let mut st = self.shared.state.lock().await;
            self.check_running(&st)?;
            let s = st.warm.pop();
            st.stats.warm = st.warm.len();
            s
        };
        let mut slot = match warm {
            Some(s) => s,
            None => self.create_reserved().await?,
        };
        slot.lease_to(self.shared.orphans.clone());
        self.spawn_refill();
        Ok(slot)
    }

    /// Takes a slot back: keeps it warm (after flushing its conntrack state)
    /// if the warm set has room, destroys it otherwise.
    pub async fn release(&self, mut slot: Slot) -> Result<()> {
        slot.end_lease();
        // The private layout, not the caller-visible copy.
        let index = slot.layout().index;
        let keep = {
            let st = self.shared.state.lock().await;
            if !st.allocated.contains(&index) {
                // Already destroyed by shutdown (or foreign): nothing to do.
                return Ok(());
            }
            st.phase == Phase::Running && st.warm.len() < self.shared.warm_target
        };
        slot.stop_proxy().await;
        if keep {
            match slot.flush_conntrack().await {
                Ok(()) => {
                    let mut st = self.shared.state.lock().await;
                    if st.phase == Phase::Running {
                        st.warm.push(slot);
                        st.stats.warm = st.warm.len();
                        st.stats.reused += 1;
                        return Ok(());
                    }
                }
                Err(e) => tracing::warn!(error = %e, "conntrack flush failed; destroying slot"),
            }
        }
        self.destroy_index(index).await
    }

    /// Destroys every slot this pool created (warm or handed out) and the
    /// root table. Handed-out `Slot`s become stale; releasing them is a no-op.
    pub async fn shutdown(&self) -> Result<()> {
        let sh = &self.shared;
        sh.state.lock().await.phase = Phase::ShutDown;
        // Wait for creations in flight; none can start after this.
        let _exclusive = sh.gate.write().await;
        let indices: Vec<usize> = {
            let mut st = sh.state.lock().await;
            st.warm.clear();
            st.stats.warm = 0;
            st.allocated.iter().copied().collect()
        };
        let mut first_err = None;
        for index in indices {
            if let Err(e) = self.destroy_index(index).await {
                tracing::warn!(error = %e, "slot teardown failed");
                first_err.get_or_insert(e);
            }
        }
        if let Err(e) = host::teardown_root(&sh.tag).await {
            first_err.get_or_insert(e);
        }
        first_err.map_or(Ok(()), Err)
    }

    pub async fn stats(&self) -> PoolStats {
        let st = self.shared.state.lock().await;
        PoolStats {
            allocated: st.allocated.len(),
            ..st.stats
        }
    }

    /// Slots a sandbox could still get: the free indices and the warm
    /// slots (made ahead, not handed out).
    pub async fn room(&self) -> usize {
        let st = self.shared.state.lock().await;
        let held = st.allocated.len().saturating_sub(st.warm.len());
        self.shared.capacity.saturating_sub(held)
    }

    /// The most slots this pool has at once.
    pub fn capacity(&self) -> usize {
        self.shared.capacity
    }

    /// Reserves the lowest free index and builds the slot.
    async fn create_reserved(&self) -> Result<Slot> {
        let sh = &self.shared;
        let _shared = sh.gate.read().await;
        let layout = {
            let mut st = sh.state.lock().await;
            self.check_running(&st)?;
            let index = (0..sh.capacity)
                .find(|i| !st.allocated.contains(i))
                .ok_or_else(|| NetError::Exhausted {
                    tag: sh.tag.to_string(),
                    capacity: sh.capacity,
                })?;
            match self.layout(index) {
                Ok(l) => {
                    st.allocated.insert(index);
                    l
                }
                Err(e) => return Err(e),
            }
        };
        let index = layout.index;
        match Slot::create(
            layout,
            sh.guest_link,
            sh.resolver.clone(),
            sh.boundary.clone(),
        )
        .await
        {
            Ok(slot) => {
                sh.state.lock().await.stats.created += 1;
                Ok(slot)
            }
            Err(e) => {
                sh.state.lock().await.allocated.remove(&index);
                Err(e)
            }
        }
    }

    fn spawn_refill(&self) {
        let pool = self.clone();
        tokio::spawn(async move {
            loop {
                {
                    let mut st = pool.shared.state.lock().await;
                    if st.phase != Phase::Running
                        || st.warm.len() + st.refilling >= pool.shared.warm_target
                        || st.allocated.len() >= pool.shared.capacity
                    {
                        return;
                    }
                    st.refilling += 1;
                }
                let made = pool.create_reserved().await;
                let mut st = pool.shared.state.lock().await;
                st.refilling -= 1;
                match made {
                    Ok(slot) => {
                        // After shutdown the slot's index stays allocated,
                        // and shutdown (which waited on the gate) or the
                        // next start's cleanup removes it.
                        st.warm.push(slot);
                        st.stats.warm = st.warm.len();
                    }
                    Err(e) => {
                        if st.phase == Phase::Running {
                            tracing::warn!(error = %e, "background slot refill failed");
                        }
                        return;
                    }
                }
            }
        });
    }

    /// Destroys a slot dropped without release, unless shutdown already
    /// took it (shutdown waits on the gate, so the two never overlap).
    async fn reap(&self, index: usize) {
        let _shared = self.shared.gate.read().await;
        {
            let st = self.shared.state.lock().await;
            if st.phase != Phase::Running || !st.allocated.contains(&index) {
                return;
            }
        }
        match self.destroy_index(index).await {
            Ok(()) => tracing::info!(slot = index, "dropped network slot destroyed"),
            Err(e) => tracing::warn!(slot = index, error = %e, "destroying a dropped slot"),
        }
        self.spawn_refill();
    }

    async fn destroy_index(&self, index: usize) -> Result<()> {
        let layout = self.layout(index)?;
        let r = destroy(&layout).await;
        let mut st = self.shared.state.lock().await;
        st.allocated.remove(&index);
        st.stats.destroyed += 1;
        r
    }

    fn check_running(&self, st: &State) -> Result<()> {
        match st.phase {
            Phase::Running => Ok(()),
            Phase::New => Err(self.state_err("not started")),
            Phase::ShutDown => Err(self.state_err("shut down")),
        }
    }

    fn state_err(&self, state: &'static str) -> NetError {
        NetError::State {
            tag: self.shared.tag.to_string(),
            state,
        }
    }
}

/// Destroys, one at a time, the slots reported dropped without release,
/// for as long as the pool exists.
async fn reap_orphans(pool: Weak<Shared>, mut orphans: UnboundedReceiver<usize>) {
    while let Some(index) = orphans.recv().await {
        let Some(shared) = pool.upgrade() else { return };
        SlotPool { shared }.reap(index).await;
    }
}
