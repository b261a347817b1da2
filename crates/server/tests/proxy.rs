//! The envd front door against a real agent (`siesta_agent::serve`) on
//! loopback: the proxy must stream Connect responses envelope by envelope,
//! stream uploads, pass the access token through, and answer for sandboxes
//! and ports it cannot reach with the JSON the SDK expects.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use futures::StreamExt;
use siesta_server::proxy::{self, SandboxTargets, Target, TargetError, TargetState};

const TOKEN: &str = "test-token";
/// The node's API key (for the control API, never for a guest).
const KEY: &str = "e2b_00112233445566778899aabbccddeeff00112233";
/// Every test gives up after this long instead of hanging.
const LIMIT: Duration = Duration::from_secs(30);

/// Sandbox "sbx1" is this host (loopback), where the agent and the echo
/// server listen; nothing else exists.
struct Loopback;

#[async_trait::async_trait]
impl SandboxTargets for Loopback {
    async fn target(&self, id: &str) -> Result<Target, TargetError> {
        match id {
            "sbx1" => Ok(Target {
                state: TargetState::Running(LOOPBACK),
                access_token: TOKEN.into(),
                traffic_token: None,
            }),
            _ => Err(TargetError::NotFound { id: id.into() }),
        }
    }

    async fn resume(&self, id: &str) -> Result<Option<IpAddr>, TargetError> {
        panic!("nothing is paused here, yet {id} was resumed")
    }
}

const LOOPBACK: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

struct Harness {
    _guest: tempfile::TempDir,
    home: std::path::PathBuf,
    /// Port of the agent.
    agent_port: u16,
    /// Base URL of the proxy (in front of a control API stand-in).
    base: String,
    http: reqwest::Client,
}

impl Harness {
    async fn start() -> Harness {
        Self::with(Arc::new(Loopback)).await
    }

    /// The agent and a front door to `targets`.
    async fn with(targets: Arc<dyn SandboxTargets>) -> Harness {
        let guest = tempfile::tempdir().unwrap();
        let root = guest.path();
        let home = root.join("home/user");
        std::fs::create_dir_all(&home).unwrap();
        // SAFETY: getuid and getgid have no preconditions and cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let passwd = root.join("passwd");
        let group = root.join("group");
        std::fs::write(
            &passwd,
            format!("user:x:{uid}:{gid}::{}:/bin/sh\n", home.display()),
        )
        .unwrap();
        std::fs::write(&group, format!("user:x:{gid}:\n")).unwrap();
        let state = siesta_agent::AgentState::new(siesta_agent::users::UserDb { passwd, group });
        {
            let mut d = state.defaults.write().await;
            d.user = Some("user".into());
            d.access_token = Some(TOKEN.into());
        }
        let agent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let agent_port = agent.local_addr().unwrap().port();
        tokio::spawn(siesta_agent::serve(agent, state));

        let control = Router::new().fallback(|| async { "control api" });
        let keys = siesta_server::ApiKeys::single(KEY);
        let app = proxy::front(control, targets, keys);
        let front = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", front.local_addr().unwrap());
        // The server's own listener (timeouts, connection handles).
        let limits = siesta_server::HttpLimits::default();
        let pending = futures::future::pending();
        tokio::spawn(siesta_server::listen::serve_app(
            front, app, limits, pending,
        ));
        Harness {
            _guest: guest,
            home,
            agent_port,
            base,
            http: reqwest::Client::builder().http1_only().build().unwrap(),
        }
    }

    /// A request for sandbox `id`'s agent, as the SDK sends it.
    fn envd(&self, method: reqwest::Method, path: &str, id: &str) -> reqwest::RequestBuilder {
        self.http
            .request(method, format!("{}{path}", self.base))
            .header("E2b-Sandbox-Id", id)
            .header("E2b-Sandbox-Port", self.agent_port.to_string())
            .header("X-Access-Token", TOKEN)
    }
}

fn envelope(json: &serde_json::Value) -> Vec<u8> {
    let body = serde_json::to_vec(json).unwrap();
    let mut out = vec![0u8];
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    out
}

/// Reads Connect envelopes off a streaming body as they arrive.
struct Envelopes<S> {
    body: S,
    buf: Vec<u8>,
}

impl<S: futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin> Envelopes<S> {
    /// The next envelope's flags and JSON, `None` at the end of the body.
    async fn next(&mut self) -> Option<(u8, serde_json::Value)> {
        loop {
            if self.buf.len() >= 5 {
                let len = u32::from_be_bytes(self.buf[1..5].try_into().unwrap()) as usize;
                if self.buf.len() >= 5 + len {
                    let flags = self.buf[0];
                    let json = serde_json::from_slice(&self.buf[5..5 + len]).unwrap();
                    self.buf.drain(..5 + len);
                    return Some((flags, json));
                }
            }
            match self.body.next().await {
                Some(chunk) => self.buf.extend_from_slice(&chunk.unwrap()),
                None => return None,
            }
        }
    }

    /// The next process event, skipping keepalives.
    async fn event(&mut self) -> serde_json::Value {
        loop {
            let (flags, msg) = self.next().await.expect("stream ended early");
            assert_eq!(flags, 0, "unexpected end of stream: {msg}");
            if msg["event"].get("keepalive").is_none() {
                return msg["event"].clone();
            }
        }
    }
}

#[tokio::test]
async fn start_output_streams_before_the_command_ends() {
    let h = Harness::start().await;
    tokio::time::timeout(LIMIT, async {
        // The command waits for a file that the test creates only after it
        // has seen the first line: a buffering proxy would deadlock here.
        let go = h.home.join("go");
        let script = format!(
            "echo first; while [ ! -e {} ]; do sleep 0.02; done; echo second",
            go.display()
        );
        let req = serde_json::json!({"process": {"cmd": "/bin/sh", "args": ["-c", script]}});
        let resp = h
            .envd(reqwest::Method::POST, "/process.Process/Start", "sbx1")
            .header("content-type", "application/connect+json")
            .header("connect-protocol-version", "1")
            .header("Keepalive-Ping-Interval", "50")
            .body(envelope(&req))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["content-type"], "application/connect+json");
        let mut events = Envelopes {
            body: resp.bytes_stream(),
            buf: Vec::new(),
        };
        assert!(events.event().await.get("start").is_some());
        let data = events.event().await;
        assert_eq!(data["data"]["stdout"], "Zmlyc3QK", "first line: {data}"); // "first\n"
        std::fs::write(&go, b"").unwrap();
        let data = events.event().await;
        assert_eq!(data["data"]["stdout"], "c2Vjb25kCg==", "{data}"); // "second\n"
        let end = events.event().await;
        assert!(end.get("end").is_some(), "{end}");
        let (flags, _) = events.next().await.expect("end-of-stream envelope");
        assert_eq!(flags, 2);
    })
    .await
    .expect("timed out");
}

#[tokio::test]
async fn uploads_stream_through_and_download_back() {
    let h = Harness::start().await;
    tokio::time::timeout(LIMIT, async {
        // 16 MiB in 64 KiB chunks of an unknown total length: chunked
        // transfer encoding both ways.
        let chunk: Vec<u8> = (0..65536u32).map(|i| (i % 251) as u8).collect();
        let chunks = 256;
        let body = futures::stream::iter(
            (0..chunks).map(move |_| Ok::<_, std::io::Error>(bytes::Bytes::from(chunk.clone()))),
        );
        let path = h.home.join("big.bin");
        let resp = h
            .envd(reqwest::Method::POST, "/files", "sbx1")
            .query(&[("path", path.to_str().unwrap())])
            .header("content-type", "application/octet-stream")
            .body(reqwest::Body::wrap_stream(body))
            .send()
            .await
            .unwrap();
        let status = resp.status();
        assert_eq!(status, 200, "{}", resp.text().await.unwrap());
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 65536 * chunks);

        let resp = h
            .envd(reqwest::Method::GET, "/files", "sbx1")
            .query(&[("path", path.to_str().unwrap())])
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let got = resp.bytes().await.unwrap();
        assert_eq!(got.len() as u64, 65536 * chunks);
        assert_eq!(&got[..], &std::fs::read(&path).unwrap()[..]);
    })
    .await
    .expect("timed out");
}

#[tokio::test]
async fn the_agent_checks_the_access_token() {
    let h = Harness::start().await;
    let url = format!("{}/envs", h.base);
    let resp = h
        .http
        .get(&url)
        .header("E2b-Sandbox-Id", "sbx1")
        .header("E2b-Sandbox-Port", h.agent_port.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    let resp = h
        .envd(reqwest::Method::GET, "/envs", "sbx1")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
}

#[tokio::test]
async fn host_names_route_to_any_port() {
    let h = Harness::start().await;
    let resp = h
        .http
        .get(format!("{}/health", h.base))
        .header("host", format!("{}-sbx1.siesta.localhost", h.agent_port))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 204);
    // Without a sandbox header or host, the control API answers.
    let resp = h
        .http
        .get(format!("{}/health", h.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.text().await.unwrap(), "control api");
}

async fn error_json(resp: reqwest::Response, status: u16) -> String {
    assert_eq!(resp.status().as_u16(), status);
    let v: serde_json::Value = resp.json().await.expect("error body is JSON");
    assert_eq!(v["code"], status, "{v}");
    v["message"].as_str().expect("message").to_string()
}

#[tokio::test]
async fn unknown_sandboxes_and_closed_ports_are_502_json() {
    let h = Harness::start().await;
    let resp = h
        .envd(reqwest::Method::GET, "/health", "nosuch")
        .send()
        .await
        .unwrap();
    let msg = error_json(resp, 502).await;
    assert!(msg.contains("was not found"), "{msg}");

    let resp = h
        .http
        .get(format!("{}/health", h.base))
        .header("host", "49983-nosuch.siesta.localhost")
        .send()
        .await
        .unwrap();
    assert!(error_json(resp, 502).await.contains("was not found"));

    // A port nothing listens on: bind one, then free it.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let resp = h
        .http
        .get(format!("{}/", h.base))
        .header("E2b-Sandbox-Id", "sbx1")
        .header("E2b-Sandbox-Port", port.to_string())
        .send()
        .await
        .unwrap();
    let msg = error_json(resp, 502).await;
    assert!(msg.contains("port is not open"), "{msg}");

    let resp = h
        .http
        .get(format!("{}/", h.base))
        .header("E2b-Sandbox-Id", "sbx1")
        .header("E2b-Sandbox-Port", "not-a-port")
        .send()
        .await
        .unwrap();
    error_json(resp, 400).await;
}

/// An upstream that echoes each request body chunk back at once.
async fn echo_server() -> u16 {
    use hyper_util::rt::TokioIo;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let (socket, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(
                    |req: hyper::Request<hyper::body::Incoming>| async move {
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(req.into_body()))
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(socket), svc)
                    .await;
            });
        }
    });
    port
}

#[tokio::test]
async fn request_and_response_bodies_stream_at_the_same_time() {
    let h = Harness::start().await;
    let port = echo_server().await;
    tokio::time::timeout(LIMIT, async {
        let (tx, rx) = futures::channel::mpsc::channel::<Result<bytes::Bytes, std::io::Error>>(1);
        let mut tx = tx;
        let resp = h
            .http
            .post(format!("{}/echo", h.base))
            .header("host", format!("{port}-sbx1.siesta.localhost"))
            .body(reqwest::Body::wrap_stream(rx));
        let pending = tokio::spawn(resp.send());
        use futures::SinkExt;
        tx.send(Ok(bytes::Bytes::from_static(b"ping-1")))
            .await
            .unwrap();
        let resp = pending.await.unwrap().unwrap();
        assert_eq!(resp.status(), 200);
        let mut body = resp.bytes_stream();
        // Each chunk comes back before the next one is sent: neither
        // direction waits for the whole body.
        let mut got = body.next().await.unwrap().unwrap().to_vec();
        while got.len() < 6 {
            got.extend_from_slice(&body.next().await.unwrap().unwrap());
        }
        assert_eq!(got, b"ping-1");
        tx.send(Ok(bytes::Bytes::from_static(b"ping-2")))
            .await
            .unwrap();
        let got = body.next().await.unwrap().unwrap();
        assert_eq!(&got[..], b"ping-2");
        drop(tx);
        assert!(body.next().await.is_none());
    })
    .await
    .expect("timed out");
}

/// An upstream that answers with the request's headers, as JSON
/// `{name: [values]}`.
async fn header_echo_server() -> u16 {
    use hyper_util::rt::TokioIo;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let (socket, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(
                    |req: hyper::Request<hyper::body::Incoming>| async move {
                        let mut seen = std::collections::BTreeMap::<String, Vec<String>>::new();
                        for (name, value) in req.headers() {
                            let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
                            seen.entry(name.to_string()).or_default().push(value);
                        }
                        let body = serde_json::to_vec(&seen).unwrap();
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(
                            axum::body::Body::from(body),
                        ))
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(socket), svc)
                    .await;
            });
        }
    });
    port
}

/// A client that sends the node's key with every request (one header set
/// for the API and the sandboxes) must not hand it to the guest: code in
/// the sandbox would read it off its own port.
#[tokio::test]
async fn the_nodes_key_never_reaches_a_guest() {
    let h = Harness::start().await;
    let port = header_echo_server().await;
    let seen = |req: reqwest::RequestBuilder| async move {
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status(), 200);
        resp.json::<serde_json::Value>().await.unwrap()
    };
    let by_host = || {
        h.http
            .get(format!("{}/", h.base))
            .header("host", format!("{port}-sbx1.siesta.localhost"))
    };
    let by_header = || {
        h.http
            .get(format!("{}/", h.base))
            .header("E2b-Sandbox-Id", "sbx1")
            .header("E2b-Sandbox-Port", port.to_string())
    };
    for req in [by_host(), by_header()] {
        let got = seen(
            req.header("X-API-KEY", KEY)
                .header("authorization", format!("Bearer {KEY}")),
        )
        .await;
        assert!(got.get("x-api-key").is_none(), "{got}");
        assert!(got.get("authorization").is_none(), "{got}");
    }
    // What is not the node's key is the app's business, and envd needs
    // its Basic user.
    let got = seen(
        by_host()
            .header("X-API-KEY", "the-apps-own-key")
            .header("authorization", "Basic dXNlcjo=")
            .header("cookie", "session=1"),
    )
    .await;
    assert_eq!(got["x-api-key"], serde_json::json!(["the-apps-own-key"]));
    assert_eq!(got["authorization"], serde_json::json!(["Basic dXNlcjo="]));
    assert_eq!(got["cookie"], serde_json::json!(["session=1"]));
    let got = seen(by_host().header("authorization", "Bearer app-token")).await;
    assert_eq!(
        got["authorization"],
        serde_json::json!(["Bearer app-token"])
    );
}
