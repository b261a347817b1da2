//! A real 3-member etcd cluster (Debian `etcd-server`, `make
//! install-test-deps`) on 127.0.0.1, in a temporary directory; every
//! member is killed by its pid on drop.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct EtcdCluster {
    members: Vec<Option<Child>>,
    pub client_urls: Vec<String>,
    _dir: tempfile::TempDir,
}

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
        // Per process, so parallel runs do not collide.
        let base = 24000 + (std::process::id() % 300) as u16 * 20;
        let peer = |i: u16| format!("http://127.0.0.1:{}", base + 10 + i);
        let client = |i: u16| format!("http://127.0.0.1:{}", base + i);
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
            _dir: dir,
        };
        cluster.wait_healthy();
        cluster
    }

    fn wait_healthy(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        for url in &self.client_urls {
            loop {
                let ok = Command::new("curl")
                    .args(["-sf", "--max-time", "1", &format!("{url}/health")])
                    .stdout(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success());
                if ok {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "etcd member {url} not healthy after 30 s"
                );
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
