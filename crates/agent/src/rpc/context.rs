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
