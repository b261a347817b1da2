//! Where the object store is: an S3 endpoint, a bucket and credentials.

use std::sync::Arc;
use std::time::Duration;

use object_store::aws::{AmazonS3Builder, S3ConditionalPut};
use object_store::{ClientOptions, ObjectStore, RetryConfig};

use super::RemoteError;

/// An S3-compatible object store (path-style addressing, as SeaweedFS and
/// MinIO want).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Config {
    /// `http://127.0.0.1:8333`.
    pub endpoint: String,
    pub bucket: String,
    pub access_key_id: String,
    pub secret_access_key: String,
    /// `us-east-1` unless said otherwise.
    pub region: String,
}

impl S3Config {
    /// From `SIESTA_S3_ENDPOINT`, `SIESTA_S3_BUCKET`, `AWS_ACCESS_KEY_ID`,
    /// `AWS_SECRET_ACCESS_KEY` and `SIESTA_S3_REGION`; `Ok(None)` when no
    /// endpoint is set, an error naming what is missing otherwise.
    pub fn from_env() -> Result<Option<Self>, RemoteError> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let Some(endpoint) = var("SIESTA_S3_ENDPOINT") else {
            return Ok(None);
        };
        let need = |k: &'static str| {
            var(k).ok_or_else(|| {
                RemoteError::Config(format!("SIESTA_S3_ENDPOINT is set but {k} is not"))
            })
        };
        Ok(Some(Self {
            endpoint,
            bucket: need("SIESTA_S3_BUCKET")?,
            access_key_id: need("AWS_ACCESS_KEY_ID")?,
            secret_access_key: need("AWS_SECRET_ACCESS_KEY")?,
            region: var("SIESTA_S3_REGION").unwrap_or_else(|| "us-east-1".into()),
        }))
    }

    /// The client. Conditional writes (`If-None-Match: *`, `If-Match`) are
    /// what publication relies on, so they are switched on explicitly.
    pub fn build(&self) -> Result<Arc<dyn ObjectStore>, RemoteError> {
        // Client options first: setting them replaces `allow_http`.
        let store = AmazonS3Builder::new()
            .with_client_options(ClientOptions::new().with_connect_timeout(CONNECT_TIMEOUT))
            .with_endpoint(&self.endpoint)
            .with_bucket_name(&self.bucket)
            .with_access_key_id(&self.access_key_id)
            .with_secret_access_key(&self.secret_access_key)
            .with_region(&self.region)
            .with_virtual_hosted_style_request(false)
            .with_allow_http(self.endpoint.starts_with("http://"))
            .with_conditional_put(S3ConditionalPut::ETagMatch)
            .with_retry(retries())
            .build()
            .map_err(|e| RemoteError::Config(format!("object store {}: {e}", self.endpoint)))?;
        Ok(Arc::new(store))
    }
}

/// A store that does not answer is reported within seconds, not after the
/// client's default three minutes of retries: a create waiting on it
/// would hang that long.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

fn retries() -> RetryConfig {
    RetryConfig {
        max_retries: 3,
        retry_timeout: Duration::from_secs(20),
        ..Default::default()
    }
}
