//! Connections counted per client address, so that one host (a slowloris
//! loop, a runaway client) cannot take every place under the server's
//! connection cap from the others.
//!
//! Past its share a peer's new connections are closed at once rather than
//! queued: the kernel's accept queue is shared, and a queue full of one
//! peer's connections would hold everyone else's back just the same.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How often a peer over its share is logged, at most.
const REFUSED_LOG_EVERY: Duration = Duration::from_secs(60);

/// Open connections per peer address, up to `max` each.
#[derive(Clone)]
pub struct PeerCounts {
    max: usize,
    state: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    open: HashMap<IpAddr, usize>,
    last_refusal_log: Option<Instant>,
}

/// One admitted connection's place in its peer's count, given back on drop.
pub struct PeerPlace {
    peer: IpAddr,
    state: Arc<Mutex<State>>,
}

impl PeerCounts {
    pub fn new(max: usize) -> Self {
        Self {
            max: max.max(1),
            state: Arc::default(),
        }
    }

    /// A place for one more connection from `peer`, or `None` when it
    /// already holds `max`.
    pub fn admit(&self, peer: IpAddr) -> Option<PeerPlace> {
        // The map is only ever updated whole: a poisoned lock still holds
        // consistent counts.
        let mut st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let open = st.open.entry(peer).or_insert(0);
        if *open >= self.max {
            let quiet = st
                .last_refusal_log
                .is_some_and(|t| t.elapsed() < REFUSED_LOG_EVERY);
            if !quiet {
                st.last_refusal_log = Some(Instant::now());
                tracing::warn!(
                    %peer,
                    max = self.max,
                    "a client is at its connection cap: its new connections are closed \
                     (server --max-connections-per-ip)"
                );
            }
            return None;
        }
        *open += 1;
        Some(PeerPlace {
            peer,
            state: self.state.clone(),
        })
    }

    /// Connections open from `peer` now.
    #[cfg(test)]
    fn open(&self, peer: IpAddr) -> usize {
        let st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        st.open.get(&peer).copied().unwrap_or(0)
    }
}

impl Drop for PeerPlace {
    fn drop(&mut self) {
        let mut st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(open) = st.open.get_mut(&self.peer) {
            *open = open.saturating_sub(1);
            if *open == 0 {
                // Forgotten at zero: the map holds only peers with a
                // connection open, however many addresses come and go.
                st.open.remove(&self.peer);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_gets_its_share_and_others_theirs() {
        let counts = PeerCounts::new(2);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let first = counts.admit(a).unwrap();
        let _second = counts.admit(a).unwrap();
        assert!(counts.admit(a).is_none(), "a third from one peer");
        let _other = counts.admit(b).unwrap();
        drop(first);
        assert_eq!(counts.open(a), 1);
        assert!(
            counts.admit(a).is_some(),
            "a place given back is free again"
        );
    }

    #[test]
    fn a_peer_with_nothing_open_is_forgotten() {
        let counts = PeerCounts::new(1);
        let a: IpAddr = "::1".parse().unwrap();
        drop(counts.admit(a).unwrap());
        assert_eq!(counts.open(a), 0);
        assert!(counts.state.lock().unwrap().open.is_empty());
    }
}
