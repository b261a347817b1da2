//! A sandbox's live VM: recording a resumed VM as the sandbox's running
//! parts, and stopping it (now, or in the background after a pause)
//! with everything it holds: the VMM, its volume exports, its network slot
//! and its run directory.

use std::sync::Arc;

use chrono::Utc;

use crate::node::Node;
use crate::resume::Resumed;
use crate::sandbox::{Running, Sandbox, SandboxState};

/// Records a freshly resumed VM as the sandbox's live parts, running
/// until `timeout` from now.
pub(crate) fn set_running(sb: &mut Sandbox, r: Running, timeout: chrono::Duration) {
    let now = Utc::now();
    let rec = &mut sb.record;
    rec.state = SandboxState::Running;
    rec.started_at = now;
    rec.end_at = now + timeout;
    rec.agent_addr = Some(r.agent_addr);
    rec.vmm_pid = Some(r.vm.pid());
    rec.timings = Some(r.timings.clone());
    rec.dead_reason = None;
    sb.running = Some(r);
}

/// The live parts of a resumed VM.
pub(crate) fn running(r: Resumed) -> Running {
    let agent_addr = siesta_host::Host::agent_addr(&r.slot);
    Running {
        vm: r.vm,
        slot: r.slot,
        exports: r.exports,
        run_dir: r.run_dir,
        agent_addr,
        timings: r.timings,
        template: r.template,
    }
}

/// Stops the sandbox's VM (waiting for a stop already under way first).
pub(crate) async fn stop_running(node: &Node, sb: &mut Sandbox) {
    finish_stopping(sb).await;
    if let Some(r) = sb.running.take() {
        stop_vm(node, &sb.record.id, r).await;
    }
}

/// Stops the sandbox's VM without waiting for it: for a pause, whose
/// snapshot is durable and whose row is committed by then, so the VMM's
/// exit (tens of ms) is off the caller's path. The next thing that needs
/// the VM gone ([`stop_running`], a resume, shutdown) waits for it.
pub(crate) fn stop_in_background(node: &Arc<Node>, sb: &mut Sandbox) {
    if let Some(r) = sb.running.take() {
        let (node, id) = (Arc::clone(node), sb.record.id.clone());
        sb.stopping = Some(tokio::spawn(async move {
            stop_vm(&node, &id, r).await;
        }));
    }
}

/// Waits for a stop [`stop_in_background`] began.
pub(crate) async fn finish_stopping(sb: &mut Sandbox) {
    if let Some(stopping) = sb.stopping.take() {
        if let Err(e) = stopping.await {
            tracing::warn!(sandbox = %sb.record.id, "stopping VMM: {e}");
        }
    }
}

async fn stop_vm(node: &Node, id: &str, mut r: Running) {
    if let Err(e) = r.vm.shutdown().await {
        tracing::warn!(sandbox = %id, "stopping VMM: {e}");
    }
    // Before the slot goes back to the pool: its next sandbox must not
    // find this one's volumes there.
    r.exports.stop().await;
    node.release_slot(r.slot).await;
    let _ = std::fs::remove_dir_all(&r.run_dir);
}
