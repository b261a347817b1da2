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
    if siesta_envd_proto::secrets_match(given, expected.as_bytes()) {
        Ok(())
    } else {
        Err(RpcError::new(
            Code::Unauthenticated,
            "missing or invalid access token",
        ))
    }
}
