//! A real 3-member etcd cluster (Debian `etcd-server`, `make
//! install-test-deps`) on 127.0.0.1, in a temporary directory; every
//! member is killed by its pid on drop. Secured as an operator would:
//! TLS with client certificates (a CA made here with rcgen) and auth on,
//! with a `root` user and a `siesta` user limited to `/siesta/`.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct EtcdCluster {
    members: Vec<Option<Child>>,
    pub client_urls: Vec<String>,
    /// Where the CA, the client certificate and the password files are.
    pub dir: tempfile::TempDir,
}

/// The password of etcd user `siesta` (file `siesta.pw` in `dir`).
pub const SIESTA_USER: &str = "siesta";
const ROOT_PASSWORD: &str = "root-pw-for-tests";

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for member in self.members.iter_mut().flatten() {
            let _ = member.kill();
            let _ = member.wait();
        }
    }
}

/// The etcd binary, or `None` (with a note) when it is not installed and
/// the tests are not required to run.
pub fn etcd_binary() -> Option<PathBuf> {
    let path =
        PathBuf::from(std::env::var_os("SIESTA_ETCD").unwrap_or_else(|| "/usr/bin/etcd".into()));
    if path.is_file() {
        return Some(path);
    }
    let why = format!(
        "{} missing (`make install-test-deps` installs etcd-server)",
        path.display()
    );
    if std::env::var_os("CI").is_some() || std::env::var_os("SIESTA_TESTS_MUST_RUN").is_some() {
        panic!("etcd test cannot run: {why}");
    }
    eprintln!("skipping etcd test: {why}");
    None
}

impl EtcdCluster {
    /// Starts three members and waits until the cluster answers.
    pub fn start(bin: &std::path::Path) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("siesta-etcd")
            .tempdir()
            .unwrap();
        // Per process and per cluster, so parallel runs do not collide.
        static STARTED: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);
        let nth = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 4;
        let base = 24000 + (std::process::id() % 150) as u16 * 80 + nth * 20;
        let peer = |i: u16| format!("http://127.0.0.1:{}", base + 10 + i);
        let client = |i: u16| format!("https://127.0.0.1:{}", base + i);
        tls::write_certificates(dir.path());
        let pem = |name: &str| dir.path().join(name).display().to_string();
        let initial: Vec<String> = (0..3).map(|i| format!("m{i}={}", peer(i))).collect();
        let mut members = Vec::new();
        for i in 0..3u16 {
            let log = std::fs::File::create(dir.path().join(format!("m{i}.log"))).unwrap();
            let child = Command::new(bin)
                .arg(format!("--name=m{i}"))
                .arg(format!(
                    "--data-dir={}",
                    dir.path().join(format!("m{i}")).display()
                ))
                .arg(format!("--listen-client-urls={}", client(i)))
                .arg(format!("--advertise-client-urls={}", client(i)))
                .arg(format!("--listen-peer-urls={}", peer(i)))
                .arg(format!("--initial-advertise-peer-urls={}", peer(i)))
                .arg(format!("--initial-cluster={}", initial.join(",")))
                .arg("--initial-cluster-state=new")
                .arg("--pre-vote")
                .arg(format!("--cert-file={}", pem("server.pem")))
                .arg(format!("--key-file={}", pem("server.key")))
                .arg(format!("--trusted-ca-file={}", pem("ca.pem")))
                .arg("--client-cert-auth")
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap();
            members.push(Some(child));
        }
        let cluster = Self {
            members,
            client_urls: (0..3).map(client).collect(),
            dir,
        };
        cluster.wait_healthy();
        cluster.enable_auth();
        cluster
    }

    /// curl with the CA and the client certificate, as `user` when given.
    fn curl(&self, path: &str, body: &str, token: Option<&str>) -> String {
        let pem = |name: &str| self.dir.path().join(name).display().to_string();
        let mut cmd = Command::new("curl");
        cmd.args(["-sS", "--max-time", "5", "--cacert", &pem("ca.pem")])
            .args(["--cert", &pem("client.pem"), "--key", &pem("client.key")])
            .arg(format!("{}{path}", self.client_urls[0]))
            .args(["-d", body]);
        if let Some(token) = token {
            cmd.args(["-H", &format!("Authorization: {token}")]);
        }
        let out = cmd.output().expect("curl");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Users root and siesta (read-write on `/siesta/` only), auth on.
    fn enable_auth(&self) {
        let pw = format!("{}-pw", SIESTA_USER);
        std::fs::write(self.dir.path().join("siesta.pw"), format!("{pw}\n")).unwrap();
        let root = format!(r#"{{"name":"root","password":"{ROOT_PASSWORD}"}}"#);
        let b64 = |s: &str| {
            use base64::Engine;
            base64::engine::general_purpose::STANDARD.encode(s)
        };
        for (path, body) in [
            ("/v3/auth/user/add", root.clone()),
            (
                "/v3/auth/user/grant",
                r#"{"user":"root","role":"root"}"#.into(),
            ),
            ("/v3/auth/role/add", r#"{"name":"siesta"}"#.into()),
            (
                "/v3/auth/user/add",
                format!(r#"{{"name":"{SIESTA_USER}","password":"{pw}"}}"#),
            ),
            (
                "/v3/auth/user/grant",
                format!(r#"{{"user":"{SIESTA_USER}","role":"siesta"}}"#),
            ),
            (
                "/v3/auth/role/grant",
                format!(
                    r#"{{"name":"siesta","perm":{{"permType":"READWRITE","key":"{}","range_end":"{}"}}}}"#,
                    b64("/siesta/"),
                    b64("/siesta0")
                ),
            ),
            ("/v3/auth/enable", "{}".into()),
        ] {
            let out = self.curl(path, &body, None);
            assert!(out.contains("header"), "etcd {path}: {out}");
        }
    }

    /// Every key and value in etcd, read as root (what a thief of etcd's
    /// data sees).
    pub fn dump(&self) -> Vec<(String, Vec<u8>)> {
        let out = self.curl("/v3/auth/authenticate", &root_json(), None);
        let v: serde_json::Value = serde_json::from_str(&out).expect(&out);
        let token = v["token"].as_str().expect("root token");
        let all = self.curl(
            "/v3/kv/range",
            r#"{"key":"AA==","range_end":"AA=="}"#,
            Some(token),
        );
        let v: serde_json::Value = serde_json::from_str(&all).expect(&all);
        use base64::Engine;
        let d = |s: &serde_json::Value| {
            base64::engine::general_purpose::STANDARD
                .decode(s.as_str().unwrap_or_default())
                .unwrap()
        };
        v["kvs"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|kv| {
                (
                    String::from_utf8_lossy(&d(&kv["key"])).into_owned(),
                    d(&kv["value"]),
                )
            })
            .collect()
    }

    /// Writes `value` at `key` as root (what a writer of etcd does).
    pub fn put_as_root(&self, key: &str, value: &[u8]) {
        use base64::Engine;
        let e = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        let out = self.curl("/v3/auth/authenticate", &root_json(), None);
        let v: serde_json::Value = serde_json::from_str(&out).expect(&out);
        let token = v["token"].as_str().expect("root token");
        let body = format!(
            r#"{{"key":"{}","value":"{}"}}"#,
            e(key.as_bytes()),
            e(value)
        );
        let out = self.curl("/v3/kv/put", &body, Some(token));
        assert!(out.contains("header"), "put {key}: {out}");
    }

    /// How a node reaches this etcd: TLS, client certificate, user siesta.
    pub fn node_config(&self) -> siesta_cluster::EtcdConfig {
        let p = |name: &str| self.dir.path().join(name);
        siesta_cluster::EtcdConfig {
            endpoints: self.client_urls.clone(),
            ca: Some(p("ca.pem")),
            client_cert: Some((p("client.pem"), p("client.key"))),
            user: Some((SIESTA_USER.into(), p("siesta.pw"))),
            insecure: false,
        }
    }

    fn wait_healthy(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        for url in &self.client_urls {
            loop {
                let pem = |name: &str| self.dir.path().join(name).display().to_string();
                let ok = Command::new("curl")
                    .args(["-sf", "--max-time", "1", "--cacert", &pem("ca.pem")])
                    .args(["--cert", &pem("client.pem"), "--key", &pem("client.key")])
                    .arg(format!("{url}/health"))
                    .stdout(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success());
                if ok {
                    break;
                }
                if Instant::now() >= deadline {
                    let log = std::fs::read_to_string(self.dir.path().join("m0.log"));
                    let log = log.unwrap_or_default();
                    let tail: Vec<&str> = log.lines().rev().take(15).collect();
                    panic!(
                        "etcd member {url} not healthy after 30 s; m0.log ends:\n{}",
                        tail.join("\n")
                    );
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }

    /// Kills member `i` (kill -9): the other two keep a quorum.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut m) = self.members[i].take() {
            let _ = m.kill();
            let _ = m.wait();
        }
    }
}

fn root_json() -> String {
    format!(r#"{{"name":"root","password":"{ROOT_PASSWORD}"}}"#)
}

mod tls {
    use std::net::{IpAddr, Ipv4Addr};
    use std::path::Path;

    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, SanType};

    /// A CA, a certificate for the members (127.0.0.1, also used by
    /// etcd's gateway as its client certificate) and one for the nodes,
    /// without a CommonName: etcd's JSON gateway refuses a client
    /// certificate that has one when auth is on (the node signs in as a
    /// user instead).
    pub fn write_certificates(dir: &Path) {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "siesta test etcd CA");
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        std::fs::write(dir.join("ca.pem"), ca_cert.pem()).unwrap();
        for (name, cn) in [("server", Some("etcd")), ("client", None)] {
            let key = KeyPair::generate().unwrap();
            let mut p = CertificateParams::new(vec!["localhost".into()]).unwrap();
            p.subject_alt_names
                .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
            p.distinguished_name = rcgen::DistinguishedName::new();
            if let Some(cn) = cn {
                p.distinguished_name.push(DnType::CommonName, cn);
            }
            let cert = p.signed_by(&key, &ca_cert, &ca_key).unwrap();
            std::fs::write(dir.join(format!("{name}.pem")), cert.pem()).unwrap();
            std::fs::write(dir.join(format!("{name}.key")), key.serialize_pem()).unwrap();
        }
    }
}
