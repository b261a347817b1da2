//! Which requests reach a sandbox, and which may wake a paused one.
//!
//! - A private sandbox's ports (all but envd's) need its traffic token on
//!   every request, running or paused.
//! - A paused sandbox is resumed only by traffic it would accept once
//!   running. On envd's port that is a request whose `X-Access-Token` is
//!   its access token, or a `/files` URL signed with that token and not
//!   expired: anything else gets 401 and the sandbox stays paused (whether
//!   or not it asked for auto-resume, so a request without the token
//!   learns no more than that it is paused). On its other ports, the
//!   traffic token if it has one; a public sandbox's ports are public, and
//!   any request to them resumes it, as in E2B.
//!
//! Without this, a sandbox id alone (ids travel in host names, so in DNS,
//! SNI, browser history and Referer) could keep a paused sandbox awake and
//! fill the node's slots.

use std::net::IpAddr;

use axum::extract::Request;
use axum::http::HeaderValue;

use super::error::ProxyError;
use super::route::{Route, ENVD_PORT};
use super::signed::SignedFiles;
use super::target::{SandboxTargets, Target, TargetError, TargetState};

/// The header that carries a sandbox's traffic access token.
pub const TRAFFIC_TOKEN_HEADER: &str = "e2b-traffic-access-token";

/// The header that carries a sandbox's envd access token.
const ACCESS_TOKEN_HEADER: &str = "x-access-token";

/// The address to forward `req` to, once it may go there: resumes the
/// sandbox first if it is paused, auto-resumes and `req` may wake it.
pub(super) async fn reach(
    targets: &dyn SandboxTargets,
    route: &Route,
    req: &Credentials,
) -> Result<IpAddr, ProxyError> {
    let id = &route.sandbox_id;
    let refused = |source| ProxyError::Target {
        id: id.clone(),
        source,
    };
    // Two rounds: a concurrent request may resume the sandbox between our
    // look-up and our resume, which then reports the wrong state.
    for _ in 0..2 {
        let target = targets.target(id).await.map_err(refused)?;
        check_traffic_token(&target, route, req)?;
        let auto_resume = match target.state {
            TargetState::Running(ip) => return Ok(ip),
            TargetState::Paused { auto_resume } => auto_resume,
        };
        if route.port == ENVD_PORT && !req.show(&target.access_token, now()) {
            return Err(refused(TargetError::Unauthorized { id: id.clone() }));
        }
        if !auto_resume {
            return Err(refused(TargetError::Paused { id: id.clone() }));
        }
        if let Some(ip) = targets.resume(id).await.map_err(refused)? {
            return Ok(ip);
        }
    }
    Err(refused(TargetError::Unavailable {
        id: id.clone(),
        detail: "its state keeps changing".into(),
    }))
}

/// Requests to a private sandbox's ports (all but envd's, which checks its
/// own access token) must carry its traffic access token.
fn check_traffic_token(
    target: &Target,
    route: &Route,
    req: &Credentials,
) -> Result<(), ProxyError> {
    let Some(want) = &target.traffic_token else {
        return Ok(());
    };
    if route.port == ENVD_PORT {
        return Ok(());
    }
    let given = req.traffic_token.as_ref().map(|v| v.as_bytes());
    if siesta_envd_proto::secrets_match(given.unwrap_or_default(), want.as_bytes()) {
        Ok(())
    } else {
        Err(ProxyError::TrafficToken {
            id: route.sandbox_id.clone(),
            port: route.port,
        })
    }
}

/// Whether `req` shows what a sandbox with these tokens asks of traffic
/// to `route`'s port: its access token (or a live signature made with it)
/// on envd's port, its traffic token on the others when it has one. The
/// cluster's front door asks this before it forwards a request to another
/// node or takes a sandbox over.
pub fn carries_tokens(
    req: &Request,
    route: &Route,
    access_token: &str,
    traffic_token: Option<&str>,
) -> bool {
    let creds = Credentials::of(req);
    if route.port == ENVD_PORT {
        return creds.show(access_token, now());
    }
    traffic_token.is_none_or(|want| {
        let given = creds.traffic_token.as_ref().map(|v| v.as_bytes());
        siesta_envd_proto::secrets_match(given.unwrap_or_default(), want.as_bytes())
    })
}

/// What a request shows of a sandbox's tokens (taken out of it, so that
/// the request itself need not be held across the look-ups).
pub struct Credentials {
    access_token: Option<HeaderValue>,
    traffic_token: Option<HeaderValue>,
    signed: Option<SignedFiles>,
}

impl Credentials {
    pub fn of(req: &Request) -> Self {
        Self {
            access_token: req.headers().get(ACCESS_TOKEN_HEADER).cloned(),
            traffic_token: req.headers().get(TRAFFIC_TOKEN_HEADER).cloned(),
            signed: SignedFiles::of(req.method(), req.uri()),
        }
    }

    /// True when the request holds `token` (in constant time), or a
    /// signature made with it that has not expired at `now` (Unix seconds).
    pub fn show(&self, token: &str, now: i64) -> bool {
        let by_header = self.access_token.as_ref().is_some_and(|given| {
            siesta_envd_proto::secrets_match(given.as_bytes(), token.as_bytes())
        });
        by_header
            || self
                .signed
                .as_ref()
                .is_some_and(|s| !s.expired(now) && s.signed_with(token))
    }
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;

    fn request(uri: &str, token: Option<&str>) -> Request {
        let mut req = Request::builder().uri(uri);
        if let Some(token) = token {
            req = req.header("X-Access-Token", token);
        }
        req.body(Body::empty()).unwrap()
    }

    fn signed_uri(token: &str, expiration: i64) -> String {
        let sig = siesta_envd_proto::file_signature("/a", "read", "", token, Some(expiration));
        let query: String = form_urlencoded::Serializer::new(String::new())
            .append_pair("path", "/a")
            .append_pair("signature", &sig)
            .append_pair("signature_expiration", &expiration.to_string())
            .finish();
        format!("/files?{query}")
    }

    #[test]
    fn the_token_or_a_live_signature_made_with_it() {
        let now = 1_000;
        assert!(Credentials::of(&request("/health", Some("tok"))).show("tok", now));
        assert!(!Credentials::of(&request("/health", Some("tok2"))).show("tok", now));
        assert!(!Credentials::of(&request("/health", Some(""))).show("tok", now));
        assert!(!Credentials::of(&request("/health", None)).show("tok", now));
        let live = request(&signed_uri("tok", now + 60), None);
        assert!(Credentials::of(&live).show("tok", now));
        assert!(!Credentials::of(&live).show("other", now));
        let expired = request(&signed_uri("tok", now - 1), None);
        assert!(!Credentials::of(&expired).show("tok", now));
    }
}
