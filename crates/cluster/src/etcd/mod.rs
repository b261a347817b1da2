//! A small etcd v3 client over etcd's JSON gateway (`/v3/kv/*`,
//! `/v3/lease/*`), which every etcd since 3.3 serves on its client port.
//!
//! Why not gRPC: the operations siesta needs (leases, puts, ranges and
//! compare-and-swap transactions) are a handful of unary calls, and the
//! gateway needs no protobuf compiler at build time. Keys and values
//! travel base64-encoded; 64-bit numbers arrive as JSON strings.
//!
//! Each call tries the configured endpoints in turn until one answers, so
//! a cluster member that is down costs one connection attempt, not an
//! error. With a user configured, the client signs in
//! (`/v3/auth/authenticate`) and sends the token etcd hands out; a token
//! etcd no longer knows (it restarted, or the token expired) is replaced
//! by signing in again. TLS and the refusal of plain HTTP: [`connect`].

mod connect;

pub use connect::EtcdConfig;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::error::{Error, Result};

/// How long one call may take before the next endpoint is tried.
const CALL_TIMEOUT: Duration = Duration::from_secs(3);

/// A key's value and the revision that last changed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    pub key: String,
    pub value: Vec<u8>,
    pub mod_revision: i64,
}

/// What a transaction compares before it runs its puts and deletes.
#[derive(Debug, Clone)]
pub enum Compare {
    /// The key does not exist.
    Absent(String),
    /// The key holds exactly this value.
    ValueIs(String, Vec<u8>),
}

/// One write inside a transaction.
#[derive(Debug, Clone)]
pub enum Op {
    Put {
        key: String,
        value: Vec<u8>,
        lease: Option<i64>,
    },
    Delete(String),
}

/// A client for one etcd cluster.
#[derive(Clone)]
pub struct Etcd {
    endpoints: Vec<String>,
    http: reqwest::Client,
    credentials: Option<connect::Credentials>,
    /// The auth token of the last sign-in (none before it, or once etcd
    /// stopped accepting it).
    token: Arc<Mutex<Option<String>>>,
}

impl Etcd {
    /// A client for the members `config` names (see [`EtcdConfig`]).
    pub fn new(config: &EtcdConfig) -> Result<Self> {
        Ok(Self {
            endpoints: config.checked_endpoints()?,
            http: config.http_client(CALL_TIMEOUT)?,
            credentials: config.credentials()?,
            token: Arc::default(),
        })
    }

    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// Grants a lease of `ttl` seconds; returns its id.
    pub async fn grant(&self, ttl: u64) -> Result<i64> {
        let v = self.call("/v3/lease/grant", json!({ "TTL": ttl })).await?;
        number(&v["ID"]).ok_or_else(|| bad_answer("lease grant", &v))
    }

    /// Renews lease `id`; returns the seconds it has left, or `None` when
    /// etcd no longer knows it (it expired).
    pub async fn keep_alive(&self, id: i64) -> Result<Option<i64>> {
        let v = self
            .call("/v3/lease/keepalive", json!({ "ID": id.to_string() }))
            .await?;
        let ttl = number(&v["result"]["TTL"]).unwrap_or(0);
        Ok((ttl > 0).then_some(ttl))
    }

    /// Ends lease `id` now: every key under it goes.
    pub async fn revoke(&self, id: i64) -> Result<()> {
        self.call("/v3/kv/lease/revoke", json!({ "ID": id.to_string() }))
            .await
            .map(drop)
    }

    pub async fn put(&self, key: &str, value: &[u8], lease: Option<i64>) -> Result<()> {
        self.call("/v3/kv/put", put_body(key, value, lease))
            .await
            .map(drop)
    }

    pub async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        let v = self
            .call("/v3/kv/range", json!({ "key": enc(key) }))
            .await?;
        Ok(kvs(&v)?.into_iter().next())
    }

    /// Every key that starts with `prefix`.
    pub async fn get_prefix(&self, prefix: &str) -> Result<Vec<KeyValue>> {
        let body = json!({ "key": enc(prefix), "range_end": enc_bytes(&prefix_end(prefix)) });
        let v = self.call("/v3/kv/range", body).await?;
        kvs(&v)
    }

    /// Runs `ops` if every comparison holds; returns whether it did.
    pub async fn txn(&self, compare: &[Compare], ops: &[Op]) -> Result<bool> {
        let compare: Vec<Value> = compare.iter().map(compare_body).collect();
        let success: Vec<Value> = ops.iter().map(op_body).collect();
        let v = self
            .call(
                "/v3/kv/txn",
                json!({ "compare": compare, "success": success }),
            )
            .await?;
        Ok(v["succeeded"].as_bool().unwrap_or(false))
    }

    /// Posts `body` to `path` on the first member that answers. A member
    /// that is unreachable or unavailable (503 while a leader is elected)
    /// is skipped; rounds repeat with a short pause for [`RETRY_FOR`].
    async fn call(&self, path: &str, body: Value) -> Result<Value> {
        let deadline = tokio::time::Instant::now() + RETRY_FOR;
        let mut last = String::new();
        loop {
            let token = self.token().await?;
            for endpoint in &self.endpoints {
                match self.call_one(endpoint, path, &body, token.as_deref()).await {
                    Ok(v) => return Ok(v),
                    Err(Attempt::Refused(e)) => return Err(e),
                    Err(Attempt::SignInAgain(detail)) => {
                        self.forget_token();
                        last = detail;
                        break;
                    }
                    Err(Attempt::TryAnother(detail)) => last = detail,
                }
            }
            // etcd 3.4 leaves a request with a token it lost (restarted)
            // unanswered rather than refusing it: after a round without an
            // answer, sign in afresh.
            self.forget_token();
            if tokio::time::Instant::now() >= deadline {
                return Err(Error::Unreachable {
                    endpoints: self.endpoints.join(","),
                    detail: last,
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The token to send: none without a user; else the last sign-in's,
    /// or a new sign-in's.
    async fn token(&self) -> Result<Option<String>> {
        let Some(creds) = &self.credentials else {
            return Ok(None);
        };
        if let Some(token) = self.cached_token() {
            return Ok(Some(token));
        }
        let body = json!({ "name": creds.name, "password": creds.password });
        let mut last = String::new();
        for endpoint in &self.endpoints {
            match self
                .call_one(endpoint, "/v3/auth/authenticate", &body, None)
                .await
            {
                Ok(v) => {
                    let token = v["token"].as_str().unwrap_or_default().to_string();
                    if token.is_empty() {
                        return Err(bad_answer("sign-in", &v));
                    }
                    if let Ok(mut slot) = self.token.lock() {
                        *slot = Some(token.clone());
                    }
                    return Ok(Some(token));
                }
                Err(Attempt::Refused(e)) => {
                    return Err(Error::Config(format!(
                        "etcd refused user {:?} (check --etcd-user and --etcd-password-file): {e}",
                        creds.name
                    )))
                }
                Err(Attempt::TryAnother(d) | Attempt::SignInAgain(d)) => last = d,
            }
        }
        // Nobody answered: the call's own round reports it.
        tracing::debug!("signing in to etcd: {last}");
        Ok(None)
    }

    fn cached_token(&self) -> Option<String> {
        self.token.lock().ok().and_then(|t| t.clone())
    }

    fn forget_token(&self) {
        if self.credentials.is_some() {
            if let Ok(mut slot) = self.token.lock() {
                *slot = None;
            }
        }
    }

    async fn call_one(
        &self,
        endpoint: &str,
        path: &str,
        body: &Value,
        token: Option<&str>,
    ) -> std::result::Result<Value, Attempt> {
        let url = format!("{endpoint}{path}");
        let mut req = self.http.post(&url).json(body);
        if let Some(token) = token {
            req = req.header(reqwest::header::AUTHORIZATION, token);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| Attempt::TryAnother(format!("{url}: {e}")))?;
        let status = resp.status();
        let bytes = read_bounded(resp)
            .await
            .map_err(|e| Attempt::TryAnother(format!("{url}: {status}: unreadable answer: {e}")))?;
        let v: Value = serde_json::from_slice(&bytes).map_err(|e| {
            let start = String::from_utf8_lossy(&bytes[..bytes.len().min(200)]);
            let detail = format!("{url}: {status}: not JSON ({e}): {:?}", start.trim());
            if status.is_client_error() {
                // Refused in words (etcd's gateway refuses a client
                // certificate with a CommonName so).
                Attempt::Refused(Error::Etcd {
                    what: path.to_string(),
                    detail,
                })
            } else {
                Attempt::TryAnother(detail)
            }
        })?;
        if status.is_server_error() {
            return Err(Attempt::TryAnother(format!(
                "{url}: {status}: {}",
                v["message"]
            )));
        }
        if status == reqwest::StatusCode::UNAUTHORIZED && self.credentials.is_some() {
            return Err(Attempt::SignInAgain(format!("{url}: {}", v["message"])));
        }
        if !status.is_success() {
            // etcd understood and refused: another member would too.
            return Err(Attempt::Refused(Error::Etcd {
                what: path.to_string(),
                detail: format!("{url}: {status}: {}", v["message"]),
            }));
        }
        Ok(v)
    }
}

/// The largest answer read from etcd: a range of every sandbox row of a
/// big cluster fits many times over, and a member (or whoever answers in
/// its place) cannot grow the node's memory without bound.
const MAX_ANSWER_BYTES: usize = 64 << 20;

async fn read_bounded(mut resp: reqwest::Response) -> std::result::Result<Vec<u8>, String> {
    let mut out = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| e.to_string())? {
        if out.len() + chunk.len() > MAX_ANSWER_BYTES {
            return Err(format!("answer over {} MiB", MAX_ANSWER_BYTES >> 20));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// How long a call keeps trying members before it fails: longer than an
/// election (about 1-2 s with three members), shorter than a node's lease.
const RETRY_FOR: Duration = Duration::from_secs(5);

enum Attempt {
    Refused(Error),
    TryAnother(String),
    /// etcd no longer knows the token sent.
    SignInAgain(String),
}

fn put_body(key: &str, value: &[u8], lease: Option<i64>) -> Value {
    let mut body = json!({ "key": enc(key), "value": enc_bytes(value) });
    if let Some(lease) = lease {
        body["lease"] = json!(lease.to_string());
    }
    body
}

fn compare_body(c: &Compare) -> Value {
    match c {
        Compare::Absent(key) => json!({
            "key": enc(key), "target": "CREATE", "result": "EQUAL", "createRevision": "0"
        }),
        Compare::ValueIs(key, value) => json!({
            "key": enc(key), "target": "VALUE", "result": "EQUAL", "value": enc_bytes(value)
        }),
    }
}

fn op_body(op: &Op) -> Value {
    match op {
        Op::Put { key, value, lease } => json!({ "requestPut": put_body(key, value, *lease) }),
        Op::Delete(key) => json!({ "requestDeleteRange": { "key": enc(key) } }),
    }
}

#[derive(Deserialize)]
struct RawKv {
    key: String,
    #[serde(default)]
    value: String,
    #[serde(default)]
    mod_revision: String,
}

fn kvs(v: &Value) -> Result<Vec<KeyValue>> {
    let Some(list) = v.get("kvs") else {
        return Ok(Vec::new());
    };
    let raw: Vec<RawKv> =
        serde_json::from_value(list.clone()).map_err(|_| bad_answer("range", v))?;
    raw.into_iter()
        .map(|kv| {
            let key = B64
                .decode(&kv.key)
                .map_err(|_| bad_answer("range key", v))?;
            Ok(KeyValue {
                key: String::from_utf8_lossy(&key).into_owned(),
                value: B64
                    .decode(&kv.value)
                    .map_err(|_| bad_answer("range value", v))?,
                mod_revision: kv.mod_revision.parse().unwrap_or(0),
            })
        })
        .collect()
}

/// The end of the range of keys starting with `prefix`: the prefix with
/// its last byte incremented (etcd's own rule).
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // All 0xff (or empty): every key from the prefix on.
    vec![0]
}

fn number(v: &Value) -> Option<i64> {
    match v {
        Value::String(s) => s.parse().ok(),
        Value::Number(n) => n.as_i64(),
        _ => None,
    }
}

fn enc(s: &str) -> String {
    B64.encode(s.as_bytes())
}

fn enc_bytes(b: &[u8]) -> String {
    B64.encode(b)
}

fn bad_answer(what: &str, v: &Value) -> Error {
    Error::Etcd {
        what: what.to_string(),
        detail: format!("unexpected answer {v}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_range_ends_after_every_key_with_the_prefix() {
        assert_eq!(prefix_end("/siesta/nodes/"), b"/siesta/nodes0".to_vec());
        assert_eq!(prefix_end("a"), b"b".to_vec());
    }

    #[test]
    fn transactions_are_written_as_the_gateway_wants_them() {
        let c = compare_body(&Compare::Absent("k".into()));
        assert_eq!(c["target"], "CREATE");
        assert_eq!(c["key"], enc("k"));
        let o = op_body(&Op::Put {
            key: "k".into(),
            value: b"v".to_vec(),
            lease: Some(7),
        });
        assert_eq!(o["requestPut"]["value"], enc("v"));
        assert_eq!(o["requestPut"]["lease"], "7");
    }

    #[test]
    fn ranges_decode_keys_values_and_revisions() {
        let v = json!({"kvs":[{"key":enc("a"),"value":enc("b"),"mod_revision":"5"}],"count":"1"});
        let got = kvs(&v).unwrap();
        assert_eq!(
            got,
            vec![KeyValue {
                key: "a".into(),
                value: b"b".to_vec(),
                mod_revision: 5
            }]
        );
        assert!(kvs(&json!({"header":{}})).unwrap().is_empty());
    }
}
