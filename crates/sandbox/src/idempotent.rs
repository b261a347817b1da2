//! Creates under an idempotency key (E2B's `Idempotency-Key` header): a
//! create retried after a timeout gets the sandbox the first attempt made
//! instead of a second VM. Keys live in SQLite for
//! [`IDEMPOTENCY_TTL_HOURS`], so this holds across server restarts.

use chrono::Utc;

use crate::error::{Error, Result};
use crate::manager::{CreateRequest, SandboxManager};
use crate::sandbox::SandboxInfo;
use crate::store;
use crate::store::{KeyedCreate, IDEMPOTENCY_TTL_HOURS};

/// Whether a keyed create made the sandbox or found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyedOutcome {
    Created,
    /// An earlier request with this key made it.
    Replayed,
}

/// E2B's key syntax: 1-255 characters from `[a-z0-9-]`.
pub fn validate_key(key: &str) -> Result<()> {
    let ok = (1..=255).contains(&key.len())
        && key
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "Idempotency-Key {key:?}: use 1 to 255 characters from a-z, 0-9 and -"
        )))
    }
}

impl SandboxManager {
    /// Creates as `req` asks unless `key` already made a sandbox: then that
    /// one is returned (resumed first if it was paused since, as `connect`
    /// does) if `request_sha256` (the request body's digest) is the one the
    /// key came with, and refused otherwise.
    pub(crate) async fn create_keyed_op(
        &self,
        key: &str,
        request_sha256: &str,
        req: CreateRequest,
    ) -> Result<(SandboxInfo, KeyedOutcome)> {
        validate_key(key)?;
        let _one_at_a_time = self.keyed_creates.lock(key).await;
        let conflict = |detail: String| Error::KeyConflict {
            key: key.to_string(),
            detail,
        };
        let owned = key.to_string();
        let found = store::db(&self.store, "looking up an idempotency key", move |s| {
            s.keyed_create(&owned, Utc::now())
        });
        if let Some(made) = found.await? {
            if made.request_sha256 != request_sha256 {
                return Err(conflict(format!(
                    "it was used with another request body within {IDEMPOTENCY_TTL_HOURS} h; use a new key"
                )));
            }
            let gone = |id: &str| {
                conflict(format!(
                    "the sandbox it created, {id}, no longer runs; use a new key"
                ))
            };
            return match self
                .connect_with_op(&made.sandbox_id, req.timeout_secs, false)
                .await
            {
                Ok((info, _)) => Ok((info, KeyedOutcome::Replayed)),
                Err(Error::SandboxNotFound { .. } | Error::WrongState { .. }) => {
                    Err(gone(&made.sandbox_id))
                }
                Err(e) => Err(e),
            };
        }
        let info = Box::pin(self.create_op(req)).await?;
        let made = KeyedCreate {
            sandbox_id: info.id.clone(),
            request_sha256: request_sha256.to_string(),
            created_at: Utc::now(),
        };
        let owned = key.to_string();
        let recorded = store::db(&self.store, "recording an idempotency key", move |s| {
            s.put_keyed_create(&owned, &made)
        });
        if let Err(e) = recorded.await {
            // Unrecorded, a retry would make a second one: take it back.
            let _ = self.kill_op(&info.id).await;
            return Err(e);
        }
        Ok((info, KeyedOutcome::Created))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_e2b_syntax() {
        assert!(validate_key("retry-1").is_ok());
        assert!(validate_key(&"a".repeat(255)).is_ok());
        for bad in ["", "Upper", "with space", "ünï", &"a".repeat(256)] {
            assert!(validate_key(bad).is_err(), "{bad}");
        }
    }
}
