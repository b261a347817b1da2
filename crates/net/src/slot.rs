//! One slot: a network namespace with a veth pair to the host and a tap (or,
//! in tests, a veth to a fake guest namespace) for the VM.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::Mutex;

use crate::boundary::Boundary;
use crate::cmd;
use crate::egress::{EgressProxy, Resolver};
use crate::error::Result;
use crate::layout::{
    SlotLayout, AGENT_PORT, FAKE_GUEST_IF, GATEWAY_ADDR, GUEST_ADDR, GUEST_MAC, GUEST_PREFIX,
    NS_VETH_MAC, NS_VETH_NAME, TAP_MAC, TAP_NAME,
};
use crate::netns;
use crate::nft;
use crate::policy::{EgressPolicy, PolicyUpdate};

/// What sits on the guest side of the slot namespace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GuestLink {
    /// Production: a persistent tap `tap0` the VMM opens by name.
    #[default]
    Tap,
    /// Tests only: `tap0` is a veth whose peer `eth0` (169.254.0.21, the
    /// guest MAC) lives in a namespace `siesta-<tag>-<N>-guest`, standing in
    /// for a VM so the DNAT path can be exercised end to end.
    Veth,
}

/// A ready slot, handed out by [`crate::SlotPool::acquire`]. The public
/// fields are copies for the caller; the pool works from its own layout.
///
/// A handed-out slot is a lease: given back with
/// [`crate::SlotPool::release`], or, if its holder is dropped first (a task
/// cancelled or panicking between acquire and release), it tells the pool
/// on drop and the pool destroys it. No path leaks a namespace.
#[derive(Debug)]
pub struct Slot {
    pub index: usize,
    pub netns_name: String,
    /// `/run/netns/NAME`: open it and `setns` before spawning the VMM.
    pub netns_path: PathBuf,
    /// Host side of the veth pair, in the root namespace.
    pub host_addr: Ipv4Addr,
    /// The slot's own address: where the host reaches the guest.
    pub slot_addr: Ipv4Addr,
    /// The guest's address inside the namespace (the same in every slot).
    pub guest_addr: Ipv4Addr,
    /// The tap the VMM opens (by name) inside the namespace.
    pub tap_name: String,
    layout: SlotLayout,
    guest_link: GuestLink,
    /// Policy currently written in the ns table; `None` when unknown. The
    /// lock also serialises concurrent updates of one slot.
    policy: Mutex<Option<EgressPolicy>>,
    /// The egress proxy, running while the policy has domain rules.
    proxy: Mutex<Option<EgressProxy>>,
    resolver: Arc<Resolver>,
    boundary: Arc<Boundary>,
    /// Set while handed out: where the slot's index goes if it is dropped
    /// without being released.
    lease: Option<UnboundedSender<usize>>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(orphans) = self.lease.take() {
            tracing::warn!(
                slot = self.layout.index,
                "network slot dropped without release: the pool destroys it"
            );
            // The pool gone means shut down: its teardown (or the next
            // start's cleanup) removes the slot.
            let _ = orphans.send(self.layout.index);
        }
    }
}

impl Slot {
    fn new(
        layout: SlotLayout,
        guest_link: GuestLink,
        resolver: Arc<Resolver>,
        boundary: Arc<Boundary>,
    ) -> Self {
        Self {
            index: layout.index,
            netns_name: layout.netns_name.clone(),
            netns_path: layout.netns_path(),
            host_addr: layout.host_addr,
            slot_addr: layout.slot_addr,
            guest_addr: GUEST_ADDR,
            tap_name: TAP_NAME.to_owned(),
            layout,
            guest_link,
            // `build` writes the default policy into the new table.
            policy: Mutex::new(Some(EgressPolicy::default())),
            proxy: Mutex::new(None),
            resolver,
            boundary,
            lease: None,
        }
    }

    /// Handed out: from now on a drop without release reports the slot to
    /// `orphans`.
    pub(crate) fn lease_to(&mut self, orphans: UnboundedSender<usize>) {
        self.lease = Some(orphans);
    }

    /// Given back (or kept by the pool): dropping it is no longer a leak.
    pub(crate) fn end_lease(&mut self) {
        self.lease = None;
    }

    /// `/run/netns/NAME`.
    pub fn netns_path(&self) -> PathBuf {
        self.layout.netns_path()
    }
    /// Host side of the veth pair, in the root namespace.
    pub fn host_veth(&self) -> &str {
        &self.layout.host_veth
    }
    /// `slot_addr:49983`, the guest agent as seen from the host.
    pub fn agent_addr(&self) -> SocketAddrV4 {
        SocketAddrV4::new(self.layout.slot_addr, AGENT_PORT)
    }
    pub fn guest_link(&self) -> GuestLink {
        self.guest_link
    }
    /// The fake guest's namespace, only with [`GuestLink::Veth`].
    pub fn guest_netns_path(&self) -> Option<PathBuf> {
        (self.guest_link == GuestLink::Veth).then(|| self.layout.guest_netns_path())
    }
    /// Policy currently in force, if known.
    pub async fn applied_policy(&self) -> Option<EgressPolicy> {
        self.policy.lock().await.clone()
    }
    pub fn layout(&self) -> &SlotLayout {
        &self.layout
    }

    /// Writes the egress chain for `policy`, unless the slot already has
    /// exactly this policy (then no nft call is made), and starts, updates
    /// or stops the slot's egress proxy to match its domain rules.
    pub async fn apply_policy(&self, policy: &EgressPolicy) -> Result<PolicyUpdate> {
        let mut applied = self.policy.lock().await;
        let index = self.layout.index;
        // The proxy first: the redirect must never point at no listener.
        self.sync_proxy(policy).await?;
        if applied.as_ref() == Some(policy) {
            tracing::debug!(slot = index, ?policy, "egress policy unchanged, skipped");
            return Ok(PolicyUpdate::Skipped);
        }
        // Unknown until the write succeeds.
        *applied = None;
        cmd::nft(
            &self.layout.scope(),
            Some(&self.layout.netns_name),
            &nft::policy_update(policy),
        )
        .await?;
        *applied = Some(policy.clone());
        tracing::debug!(slot = index, ?policy, "egress policy applied");
        Ok(PolicyUpdate::Applied)
    }

    /// Starts the proxy for a policy with domain rules (or hands it the new
    /// rules); stops it for one without.
    async fn sync_proxy(&self, policy: &EgressPolicy) -> Result<()> {
        let mut proxy = self.proxy.lock().await;
        match (&*proxy, policy.has_domains()) {
            (Some(running), true) => running.update(policy.clone()),
            (None, true) => {
                *proxy = Some(
                    EgressProxy::start(
                        self.layout.scope(),
                        self.netns_path(),
                        self.resolver.clone(),
                        self.boundary.clone(),
                        policy.clone(),
                    )
                    .await?,
                );
            }
            (_, false) => *proxy = None,
        }
        Ok(())
    }

    /// Stops the egress proxy and every connection it carries (the slot
    /// changes hands); the next [`Slot::apply_policy`] starts it again if
    /// the policy needs it.
    pub(crate) async fn stop_proxy(&self) {
        *self.proxy.lock().await = None;
    }

    /// Forgets which policy was applied, so the next [`Slot::apply_policy`]
    /// writes it again (for a caller that does not trust a reused slot's
    /// rules, and for measuring what skipping saves).
    pub async fn forget_policy(&self) {
        *self.policy.lock().await = None;
    }

    /// Forgets the connection-tracking state of the previous tenant.
    pub(crate) async fn flush_conntrack(&self) -> Result<()> {
        netns::in_netns(
            &self.layout.scope(),
            self.netns_path(),
            "flush conntrack",
            netns::flush_conntrack,
        )
        .await
    }

    /// Creates every piece of the slot; on failure removes what was made.
    pub(crate) async fn create(
        layout: SlotLayout,
        guest_link: GuestLink,
        resolver: Arc<Resolver>,
        boundary: Arc<Boundary>,
    ) -> Result<Self> {
        match build(&layout, guest_link).await {
            Ok(()) => Ok(Self::new(layout, guest_link, resolver, boundary)),
            Err(e) => {
                if let Err(cleanup) = destroy(&layout).await {
                    tracing::warn!(error = %cleanup, "cleanup after failed slot creation");
                }
                Err(e)
            }
        }
    }
}

async fn build(l: &SlotLayout, guest_link: GuestLink) -> Result<()> {
    let scope = l.scope();
    let ns = l.netns_name.as_str();
    let host_cidr = format!("{}/30", l.host_addr);
    let slot_cidr = format!("{}/30", l.slot_addr);
    let gw_cidr = format!("{GATEWAY_ADDR}/{GUEST_PREFIX}");
    let guest_cidr = format!("{GUEST_ADDR}/{GUEST_PREFIX}");
    let host_addr = l.host_addr.to_string();

    cmd::ip(&scope, &["netns", "add", ns]).await?;
    cmd::ip(
        &scope,
        &[
            "link",
            "add",
            &l.host_veth,
            "type",
            "veth",
            "peer",
            "name",
            NS_VETH_NAME,
            "address",
            NS_VETH_MAC,
            "netns",
            ns,
        ],
    )
    .await?;
    // The host's end comes up last, once the namespace's end answers: a
    // packet routed to the slot address before that (a host connection to
    // the slot's previous sandbox retransmitting) would leave an
    // unanswered ARP request, and the kernel asks again only a second
    // later, holding every packet to the slot (the next sandbox's first
    // `/health`) until then.
    cmd::ip(&scope, &["addr", "add", &host_cidr, "dev", &l.host_veth]).await?;

    match guest_link {
        GuestLink::Tap => {
            cmd::ip_in(
                &scope,
                ns,
                &["tuntap", "add", "dev", TAP_NAME, "mode", "tap"],
            )
            .await?;
        }
        GuestLink::Veth => {
            let gns = l.guest_netns_name.as_str();
            cmd::ip(&scope, &["netns", "add", gns]).await?;
            cmd::ip_in(
                &scope,
                ns,
                &[
                    "link",
                    "add",
                    TAP_NAME,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    FAKE_GUEST_IF,
                    "netns",
                    gns,
                ],
            )
            .await?;
            let gateway = GATEWAY_ADDR.to_string();
            batch(
                &scope,
                gns,
                &[
                    &["link", "set", "lo", "up"],
                    &["link", "set", FAKE_GUEST_IF, "address", GUEST_MAC],
                    &["addr", "add", &guest_cidr, "dev", FAKE_GUEST_IF],
                    &["link", "set", FAKE_GUEST_IF, "up"],
                    &["route", "add", "default", "via", &gateway],
                ],
            )
            .await?;
        }
    }

    let guest = GUEST_ADDR.to_string();
    batch(
        &scope,
        ns,
        &[
            &["link", "set", "lo", "up"],
            &["addr", "add", &slot_cidr, "dev", NS_VETH_NAME],
            &["link", "set", NS_VETH_NAME, "up"],
            &["route", "add", "default", "via", &host_addr],
            &["link", "set", TAP_NAME, "address", TAP_MAC],
            &["addr", "add", &gw_cidr, "dev", TAP_NAME],
            &["link", "set", TAP_NAME, "up"],
            // Saves an ARP round trip right after a resume.
            &[
                "neigh",
                "replace",
                &guest,
                "lladdr",
                GUEST_MAC,
                "dev",
                TAP_NAME,
                "nud",
                "permanent",
            ],
        ],
    )
    .await?;
    let slot_addr = l.slot_addr.to_string();
    cmd::ip(&scope, &["link", "set", &l.host_veth, "up"]).await?;
    // And with the neighbour fixed the host never resolves it at all.
    cmd::ip(
        &scope,
        &[
            "neigh",
            "replace",
            &slot_addr,
            "lladdr",
            NS_VETH_MAC,
            "dev",
            &l.host_veth,
            "nud",
            "permanent",
        ],
    )
    .await?;

    netns::in_netns(&scope, l.netns_path(), "enable ip_forward", || {
        std::fs::write("/proc/sys/net/ipv4/ip_forward", "1")
    })
    .await?;
    netns::in_netns(&scope, l.netns_path(), "disable IPv6", netns::disable_ipv6).await?;

    cmd::nft(
        &scope,
        Some(ns),
        &nft::slot_table(l, &EgressPolicy::default()),
    )
    .await?;
    Ok(())
}

/// `ip -n NS -batch -`: one process for many commands; a failure reports the
/// failing line in stderr.
async fn batch(scope: &str, ns: &str, lines: &[&[&str]]) -> Result<()> {
    let script: String = lines.iter().map(|l| l.join(" ") + "\n").collect();
    cmd::run(scope, "ip", &["-n", ns, "-batch", "-"], Some(&script))
        .await
        .map(drop)
}

/// Removes the slot by exact names: the host veth (synchronously, so the
/// name can be reused at once), the fake guest namespace and the namespace
/// (whose tap and veth end go with it). Missing pieces are not an error.
pub(crate) async fn destroy(l: &SlotLayout) -> Result<()> {
    let scope = l.scope();
    if Path::new("/sys/class/net").join(&l.host_veth).exists() {
        cmd::ip(&scope, &["link", "del", &l.host_veth]).await?;
    }
    for ns in [&l.guest_netns_name, &l.netns_name] {
        if crate::layout::netns_path(ns).exists() {
            cmd::ip(&scope, &["netns", "del", ns]).await?;
        }
    }
    Ok(())
}
