//! The access-token check shared by the plain HTTP endpoints and the RPCs.
//!
//! Once `/init` has set a token, every request except `/health` must carry it
//! as `X-Access-Token`. Before that, requests are open: the host sets the token
//! right after boot (and again after resume, with the same value).

use http::HeaderMap;

use crate::rpc::{Code, RpcError};
use crate::state::AgentState;

/// The header the E2B SDK sends the sandbox's `envdAccessToken` in.
pub const ACCESS_TOKEN_HEADER: &str = "x-access-token";

/// `Ok` when no token is set or `headers` carries the matching one; otherwise
/// an `unauthenticated` error (HTTP 401).
pub async fn check_access_token(state: &AgentState, headers: &HeaderMap) -> Result<(), RpcError> {
    let defaults = state.defaults.read().await;
    let Some(expected) = defaults.access_token.as_deref() else {
        return Ok(());
    };
    let given = headers
        .get(ACCESS_TOKEN_HEADER)
        .map(|v| v.as_bytes())
        .unwrap_or_default();
    if constant_time_eq(given, expected.as_bytes()) {
        Ok(())
    } else {
        Err(RpcError::new(
            Code::Unauthenticated,
            "missing or invalid access token",
        ))
    }
}

/// Compares without an early exit so the time taken does not reveal how long a
/// matching prefix an attacker has guessed. The length is not secret.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compares_exactly() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"x"));
        assert!(constant_time_eq(b"", b""));
    }
}
