//! What a handler learns about the request besides its message.

use std::time::Duration;

/// Per-request facts taken from the HTTP headers, resolved before the handler
/// runs.
#[derive(Debug, Clone)]
pub struct RequestContext {
    /// The user the request acts as: from `Authorization: Basic base64(user:)`,
    /// else the default user set by `/init` (else `root`).
    pub user: String,
    /// `connect-timeout-ms`, if sent. For `Process/Start` it bounds the
    /// process's lifetime, not the stream's.
    pub timeout: Option<Duration>,
    /// `Keepalive-Ping-Interval` (seconds), if sent: how long a stream may stay
    /// silent before a keepalive event is sent.
    pub keepalive: Option<Duration>,
}

impl RequestContext {
    /// Reads the context from request headers. `default_user` is the `/init`
    /// default, used when no Basic credentials are sent.
    pub fn from_headers(
        headers: &http::HeaderMap,
        default_user: Option<&str>,
    ) -> Result<Self, super::RpcError> {
        use super::RpcError;
        let header = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::trim)
        };

        let timeout = match header("connect-timeout-ms") {
            None => None,
            // The Connect spec caps the header at 10 digits.
            Some(v) => Some(Duration::from_millis(
                v.parse::<u64>()
                    .ok()
                    .filter(|_| v.len() <= 10)
                    .ok_or_else(|| {
                        RpcError::invalid_argument(format!("bad connect-timeout-ms {v:?}"))
                    })?,
            )),
        };
        let keepalive = header("keepalive-ping-interval")
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|s| *s > 0)
            .map(Duration::from_secs);
        let user = match header("authorization") {
            Some(v) => basic_user(v).ok_or_else(|| {
                RpcError::new(
                    super::Code::Unauthenticated,
                    "malformed Authorization header",
                )
            })?,
            None => default_user.unwrap_or("root").to_string(),
        };
        Ok(Self {
            user,
            timeout,
            keepalive,
        })
    }
}

/// The user name in `Basic base64(user:password)`; the password is ignored
/// (the SDK sends it empty: the access token is the credential).
fn basic_user(value: &str) -> Option<String> {
    use base64::Engine;
    let (scheme, rest) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let raw = base64::engine::general_purpose::STANDARD
        .decode(rest.trim())
        .ok()?;
    let text = String::from_utf8(raw).ok()?;
    let user = text.split(':').next()?.to_string();
    (!user.is_empty()).then_some(user)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_user_timeout_and_keepalive() {
        let mut h = http::HeaderMap::new();
        let ctx = RequestContext::from_headers(&h, None).unwrap();
        assert_eq!(
            (ctx.user.as_str(), ctx.timeout, ctx.keepalive),
            ("root", None, None)
        );
        assert_eq!(
            RequestContext::from_headers(&h, Some("user")).unwrap().user,
            "user"
        );

        h.insert("authorization", "Basic cm9vdDo=".parse().unwrap());
        h.insert("connect-timeout-ms", "500".parse().unwrap());
        h.insert("keepalive-ping-interval", "50".parse().unwrap());
        let ctx = RequestContext::from_headers(&h, Some("user")).unwrap();
        assert_eq!(ctx.user, "root");
        assert_eq!(ctx.timeout, Some(Duration::from_millis(500)));
        assert_eq!(ctx.keepalive, Some(Duration::from_secs(50)));

        h.insert("connect-timeout-ms", "soon".parse().unwrap());
        assert!(RequestContext::from_headers(&h, None).is_err());
        h.remove("connect-timeout-ms");
        h.insert("authorization", "Bearer x".parse().unwrap());
        assert!(RequestContext::from_headers(&h, None).is_err());
    }
}
