//! Which requests wake a paused sandbox through the front door: only those
//! it would accept once running (its envd access token, a live signed URL,
//! its traffic token on a private port). The rest get 401 (or 403) and the
//! sandbox stays paused: a leaked sandbox id alone must not keep it awake.

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use siesta_server::proxy::{self, SandboxTargets, Target, TargetError, TargetState};

const TOKEN: &str = "the-access-token";
const TRAFFIC: &str = "the-traffic-token";

/// Paused sandboxes that run on loopback once resumed: `sleepy` and
/// `private` (with a traffic token) auto-resume, `napping` does not.
#[derive(Default)]
struct Sleepers {
    resumed: Mutex<HashSet<String>>,
}

impl Sleepers {
    fn resumed(&self, id: &str) -> bool {
        self.resumed.lock().unwrap().contains(id)
    }
}

#[async_trait::async_trait]
impl SandboxTargets for Sleepers {
    async fn target(&self, id: &str) -> Result<Target, TargetError> {
        let (auto_resume, traffic_token) = match id {
            "sleepy" => (true, None),
            "private" => (true, Some(TRAFFIC.to_string())),
            "napping" => (false, None),
            _ => return Err(TargetError::NotFound { id: id.into() }),
        };
        let state = if self.resumed(id) {
            TargetState::Running(IpAddr::from([127, 0, 0, 1]))
        } else {
            TargetState::Paused { auto_resume }
        };
        Ok(Target {
            state,
            access_token: TOKEN.into(),
            traffic_token,
        })
    }

    async fn resume(&self, id: &str) -> Result<Option<IpAddr>, TargetError> {
        self.resumed.lock().unwrap().insert(id.to_string());
        Ok(Some(IpAddr::from([127, 0, 0, 1])))
    }

    async fn signed_by(&self, signed: &proxy::SignedFiles) -> Option<String> {
        signed.signed_with(TOKEN).then(|| "sleepy".to_string())
    }
}

struct Front {
    targets: Arc<Sleepers>,
    base: String,
    http: reqwest::Client,
}

impl Front {
    async fn start() -> Front {
        let targets = Arc::new(Sleepers::default());
        let control = Router::new().fallback(|| async { "control api" });
        let keys = siesta_server::ApiKeys::single("e2b_00");
        let app = proxy::front(control, targets.clone(), keys);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Front {
            targets,
            base,
            http: reqwest::Client::new(),
        }
    }

    /// A request to envd's port of sandbox `id`, as the SDK routes it.
    fn envd(&self, id: &str, path: &str) -> reqwest::RequestBuilder {
        self.http
            .get(format!("{}{path}", self.base))
            .header("E2b-Sandbox-Id", id)
    }

    async fn status(&self, req: reqwest::RequestBuilder) -> u16 {
        req.send().await.unwrap().status().as_u16()
    }
}

fn signed_files(token: &str, expiration: i64) -> String {
    let sig = siesta_envd_proto::file_signature("/a", "read", "", token, Some(expiration));
    let query: String = form_urlencoded::Serializer::new(String::new())
        .append_pair("path", "/a")
        .append_pair("signature", &sig)
        .append_pair("signature_expiration", &expiration.to_string())
        .finish();
    format!("/files?{query}")
}

fn now() -> i64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    since.unwrap().as_secs() as i64
}

/// The attack of the review: `curl -H 'E2b-Sandbox-Id: ID' node/health` in
/// a loop, with no token.
#[tokio::test]
async fn envd_traffic_without_the_token_does_not_wake_a_sandbox() {
    let f = Front::start().await;
    for path in ["/health", "/envs", "/files?path=/a"] {
        assert_eq!(f.status(f.envd("sleepy", path)).await, 401, "{path}");
    }
    let wrong = f
        .envd("sleepy", "/health")
        .header("X-Access-Token", "guess");
    assert_eq!(f.status(wrong).await, 401);
    // By host name, envd's port named in it.
    let by_host = f
        .http
        .get(format!("{}/health", f.base))
        .header("host", "49983-sleepy.siesta.localhost");
    assert_eq!(f.status(by_host).await, 401);
    let resp = f.envd("sleepy", "/health").send().await.unwrap();
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["code"], 401, "{body}");
    assert!(!f.targets.resumed("sleepy"), "woken without the token");

    // The SDK's own request wakes it (what answers after that is the
    // guest's business: nothing listens on loopback's 49983 here).
    let right = f.envd("sleepy", "/health").header("X-Access-Token", TOKEN);
    assert_ne!(f.status(right).await, 401);
    assert!(f.targets.resumed("sleepy"));
}

#[tokio::test]
async fn a_live_signed_url_wakes_it_an_expired_one_does_not() {
    let f = Front::start().await;
    let expired = f.envd("sleepy", &signed_files(TOKEN, now() - 60));
    assert_eq!(f.status(expired).await, 401);
    let forged = f.envd("sleepy", &signed_files("not-the-token", now() + 60));
    assert_eq!(f.status(forged).await, 401);
    assert!(!f.targets.resumed("sleepy"));
    let live = f.envd("sleepy", &signed_files(TOKEN, now() + 60));
    assert_ne!(f.status(live).await, 401);
    assert!(f.targets.resumed("sleepy"));
}

#[tokio::test]
async fn a_signed_url_naming_no_sandbox_must_be_live_too() {
    let f = Front::start().await;
    let url = |exp| format!("{}{}", f.base, signed_files(TOKEN, exp));
    assert_eq!(f.status(f.http.get(url(now() - 60))).await, 401);
    assert!(!f.targets.resumed("sleepy"));
    assert_ne!(f.status(f.http.get(url(now() + 60))).await, 401);
    assert!(f.targets.resumed("sleepy"));
}

#[tokio::test]
async fn a_sandbox_without_auto_resume_tells_only_the_token_holder_it_is_paused() {
    let f = Front::start().await;
    assert_eq!(f.status(f.envd("napping", "/health")).await, 401);
    let resp = f
        .envd("napping", "/health")
        .header("X-Access-Token", TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 502);
    assert!(resp.text().await.unwrap().contains("it is paused"));
    assert!(!f.targets.resumed("napping"));
}

#[tokio::test]
async fn a_private_port_needs_the_traffic_token_envd_the_access_token() {
    let f = Front::start().await;
    let port = |p: u16| {
        f.envd("private", "/")
            .header("E2b-Sandbox-Port", p.to_string())
    };
    assert_eq!(f.status(port(8080)).await, 403);
    let wrong = port(8080).header("e2b-traffic-access-token", "guess");
    assert_eq!(f.status(wrong).await, 403);
    // The access token is envd's, not the private ports'.
    assert_eq!(
        f.status(port(8080).header("X-Access-Token", TOKEN)).await,
        403
    );
    assert_eq!(f.status(f.envd("private", "/health")).await, 401);
    assert!(!f.targets.resumed("private"));
    let right = port(8080).header("e2b-traffic-access-token", TRAFFIC);
    assert_ne!(f.status(right).await, 403);
    assert!(f.targets.resumed("private"));
}

#[tokio::test]
async fn a_public_sandboxs_other_ports_wake_it_as_in_e2b() {
    let f = Front::start().await;
    let app = f.envd("sleepy", "/").header("E2b-Sandbox-Port", "8080");
    assert_ne!(f.status(app).await, 401);
    assert!(f.targets.resumed("sleepy"));
}
