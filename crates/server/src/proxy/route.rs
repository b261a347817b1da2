//! Which requests belong to a sandbox, and to which of its ports.
//!
//! Two forms reach a sandbox (`shared/reference/e2b-contract.md` §1.2, §1.4):
//! the `E2b-Sandbox-Id` header (with `E2b-Sandbox-Port`, default 49983, the
//! envd port), which the SDK sends on every envd call when one
//! `E2B_SANDBOX_URL` serves all sandboxes; and a host name
//! `{port}-{sandboxID}.{domain}`, for any port a program in the sandbox
//! listens on. Everything else is the control API.

use axum::http::{header, HeaderMap, Uri};

/// The guest agent's (envd's) port.
pub const ENVD_PORT: u16 = 49983;
pub const SANDBOX_ID_HEADER: &str = "e2b-sandbox-id";
pub const SANDBOX_PORT_HEADER: &str = "e2b-sandbox-port";

/// A sandbox and one of its ports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub sandbox_id: String,
    pub port: u16,
}

/// A request that names a sandbox but does so wrongly.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RouteError {
    #[error("invalid {SANDBOX_ID_HEADER} header: expected letters and digits")]
    BadSandboxId,
    #[error("invalid {SANDBOX_PORT_HEADER} header {0:?}: expected a port number 1-65535")]
    BadPort(String),
}

/// The sandbox route of a request, `None` for the control API.
pub fn route_of(headers: &HeaderMap, uri: &Uri) -> Result<Option<Route>, RouteError> {
    if let Some(id) = headers.get(SANDBOX_ID_HEADER) {
        let id = id
            .to_str()
            .ok()
            .filter(|id| valid_id(id))
            .ok_or(RouteError::BadSandboxId)?;
        let port = match headers.get(SANDBOX_PORT_HEADER) {
            None => ENVD_PORT,
            Some(v) => {
                let text = String::from_utf8_lossy(v.as_bytes()).into_owned();
                parse_port(text.trim()).ok_or(RouteError::BadPort(text))?
            }
        };
        return Ok(Some(Route {
            sandbox_id: id.to_string(),
            port,
        }));
    }
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| uri.host());
    Ok(host.and_then(route_of_host))
}

/// Parses `{port}-{sandboxID}.{domain}[:{listen port}]`.
pub fn route_of_host(host: &str) -> Option<Route> {
    if host.starts_with('[') {
        return None; // an IPv6 literal
    }
    let name = host.split_once(':').map_or(host, |(name, _)| name);
    let (label, domain) = name.split_once('.')?;
    if domain.is_empty() {
        return None;
    }
    let (port, id) = label.split_once('-')?;
    let id = id.to_ascii_lowercase();
    if !valid_id(&id) {
        return None;
    }
    Some(Route {
        sandbox_id: id,
        port: parse_port(port)?,
    })
}

fn parse_port(text: &str) -> Option<u16> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse::<u16>().ok().filter(|p| *p != 0)
}

/// Sandbox ids are letters and digits (`siesta_sandbox::ids`); anything else
/// cannot name one and must not reach a path or a log unchecked.
fn valid_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    fn route(id: &str, port: u16) -> Option<Route> {
        Some(Route {
            sandbox_id: id.into(),
            port,
        })
    }

    #[test]
    fn header_routes_default_to_the_envd_port() {
        let uri = Uri::from_static("/process.Process/Start");
        let h = headers(&[("e2b-sandbox-id", "abc123"), ("host", "127.0.0.1:3000")]);
        assert_eq!(route_of(&h, &uri), Ok(route("abc123", ENVD_PORT)));
        let h = headers(&[("E2b-Sandbox-Id", "abc123"), ("E2b-Sandbox-Port", "8080")]);
        assert_eq!(route_of(&h, &uri), Ok(route("abc123", 8080)));
    }

    #[test]
    fn bad_headers_are_errors_not_control_requests() {
        let uri = Uri::from_static("/");
        let h = headers(&[("e2b-sandbox-id", "../etc")]);
        assert_eq!(route_of(&h, &uri), Err(RouteError::BadSandboxId));
        let h = headers(&[("e2b-sandbox-id", "")]);
        assert_eq!(route_of(&h, &uri), Err(RouteError::BadSandboxId));
        for port in ["0", "65536", "-1", "http", ""] {
            let h = headers(&[("e2b-sandbox-id", "abc"), ("e2b-sandbox-port", port)]);
            assert!(
                matches!(route_of(&h, &uri), Err(RouteError::BadPort(_))),
                "{port}"
            );
        }
    }

    #[test]
    fn host_routes() {
        assert_eq!(
            route_of_host("8080-abc123.sandbox.local"),
            route("abc123", 8080)
        );
        assert_eq!(
            route_of_host("49983-AbC.localhost:3000"),
            route("abc", 49983)
        );
        let h = headers(&[("host", "3000-xyz.example.com")]);
        assert_eq!(route_of(&h, &Uri::from_static("/")), Ok(route("xyz", 3000)));
    }

    #[test]
    fn control_hosts_are_not_routes() {
        for host in [
            "127.0.0.1:3000",
            "localhost:3000",
            "localhost",
            "api-server.example.com",
            "8080-abc",
            "8080-.example.com",
            "-abc.example.com",
            "8080-abc.",
            "99999-abc.example.com",
            "[::1]:3000",
            "8080-a_b.example.com",
        ] {
            assert_eq!(route_of_host(host), None, "{host}");
        }
        let h = headers(&[("host", "127.0.0.1:3000")]);
        assert_eq!(route_of(&h, &Uri::from_static("/sandboxes")), Ok(None));
    }
}
