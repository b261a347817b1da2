//! One async lock per key: work on one key waits for earlier work on the
//! same key only, never for unrelated keys (a node-wide lock would
//! serialise every keyed create behind the slowest one).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

type Lock = Arc<tokio::sync::Mutex<()>>;

/// The locks of the keys in use; a key's lock goes with its last holder.
#[derive(Default)]
pub struct KeyLocks {
    locks: Mutex<HashMap<String, Lock>>,
}

/// Held while the key's work runs.
pub struct KeyGuard<'a> {
    owner: &'a KeyLocks,
    key: String,
    lock: Lock,
    held: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl KeyLocks {
    /// Waits until nobody else holds `key`, then holds it.
    pub async fn lock(&self, key: &str) -> KeyGuard<'_> {
        let lock = self.map().entry(key.to_string()).or_default().clone();
        let held = lock.clone().lock_owned().await;
        KeyGuard {
            owner: self,
            key: key.to_string(),
            lock,
            held: Some(held),
        }
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Lock>> {
        // The map is left consistent at every point a panic could occur.
        self.locks.lock().unwrap_or_else(|p| p.into_inner())
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map().len()
    }
}

impl Drop for KeyGuard<'_> {
    fn drop(&mut self) {
        self.held.take();
        let mut map = self.owner.map();
        // Clones are taken under the map's lock, so the count is exact
        // here: the map's and ours alone mean nobody waits for the key.
        if Arc::strong_count(&self.lock) == 2 {
            map.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn one_key_waits_for_itself_only() {
        let locks = KeyLocks::default();
        let a = locks.lock("a").await;
        // Another key is free at once.
        let b = tokio::time::timeout(Duration::from_secs(1), locks.lock("b")).await;
        assert!(b.is_ok(), "key b waited for key a");
        drop(b);
        // The same key waits until the first holder is done.
        let again = tokio::time::timeout(Duration::from_millis(100), locks.lock("a")).await;
        assert!(again.is_err(), "key a was held twice");
        drop(a);
        let again = tokio::time::timeout(Duration::from_secs(1), locks.lock("a")).await;
        assert!(again.is_ok());
        drop(again);
        assert_eq!(locks.len(), 0, "locks of keys no longer in use are dropped");
    }
}
