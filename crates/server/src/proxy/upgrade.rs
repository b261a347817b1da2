//! Protocol upgrades (WebSocket and friends) through the proxy: once the
//! guest answers 101, both connections are handed over and bytes are
//! copied both ways until either side closes.

use axum::http::Response;
use hyper::body::Incoming;
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;

/// Joins the client's connection to the guest's after a 101 answer.
pub fn splice(id: &str, client: Option<OnUpgrade>, guest_resp: &mut Response<Incoming>) {
    let Some(client) = client else {
        tracing::warn!(
            sandbox = id,
            "guest switched protocols on a request that cannot upgrade"
        );
        return;
    };
    let guest = hyper::upgrade::on(guest_resp);
    let id = id.to_string();
    tokio::spawn(async move {
        let (client, guest) = match tokio::try_join!(client, guest) {
            Ok(both) => both,
            Err(e) => {
                tracing::debug!(sandbox = id, "upgrade failed: {e}");
                return;
            }
        };
        let mut client = TokioIo::new(client);
        let mut guest = TokioIo::new(guest);
        if let Err(e) = tokio::io::copy_bidirectional(&mut client, &mut guest).await {
            tracing::debug!(sandbox = id, "upgraded connection ended: {e}");
        }
    });
}
