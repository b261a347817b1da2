//! `siesta-image` against real tools: a Debian `docker-registry` on
//! 127.0.0.1 (its own configuration and port, plain HTTP, one instance with
//! a password), images made without Docker by `umoci` and pushed by
//! `skopeo` as OCI and Docker v2s2 manifests, a local OCI layout and a
//! docker-archive. `make test` installs the tools
//! (scripts/install-test-deps.sh); without them these tests fail and say so.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use siesta_image::{
    fetch, unpack_layers, BlobStore, Credentials, FetchOptions, ImageError, ImageLimits,
    ImageSource, ProgressEvent,
};

fn run(cmd: &mut Command) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e} (run scripts/install-test-deps.sh)"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A registry process, killed by its pid when dropped (also on panic).
struct Registry {
    child: Child,
    port: u16,
}

impl Registry {
    fn start(dir: &Path, htpasswd: Option<&Path>) -> Registry {
        let port = free_port();
        let auth = htpasswd.map_or(String::new(), |p| {
            format!(
                "auth: {{htpasswd: {{realm: siesta-test, path: {}}}}}\n",
                p.display()
            )
        });
        let config = dir.join(format!("registry-{port}.yml"));
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog: {{level: error, accesslog: {{disabled: true}}}}\n\
                 storage: {{filesystem: {{rootdirectory: {}}}, delete: {{enabled: true}}}}\n\
                 http: {{addr: 127.0.0.1:{port}, secret: siesta-test}}\n{auth}",
                dir.join(format!("data-{port}")).display()
            ),
        )
        .unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("docker-registry missing: run scripts/install-test-deps.sh");
        let reg = Registry { child, port };
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "registry did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        reg
    }

    fn name(&self, repo: &str) -> String {
        format!("127.0.0.1:{}/{repo}", self.port)
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An OCI layout `DIR/layout:tiny` of two layers made with umoci: busybox
/// with a few files, then a layer that deletes one (a whiteout) and adds
/// another; with Env, WorkingDir, User and Cmd in its config.
fn make_layout(dir: &Path) -> PathBuf {
    let layout = dir.join("layout");
    let bundle = dir.join("bundle");
    let image = format!("{}:tiny", layout.display());
    run(Command::new("umoci")
        .args(["init", "--layout"])
        .arg(&layout));
    run(Command::new("umoci").args(["new", "--image", &image]));
    run(Command::new("umoci")
        .args(["unpack", "--image", &image])
        .arg(&bundle));
    let root = bundle.join("rootfs");
    for d in ["bin", "etc", "srv"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    std::fs::copy("/bin/busybox", root.join("bin/busybox")).unwrap();
    std::os::unix::fs::symlink("busybox", root.join("bin/sh")).unwrap();
    std::fs::write(root.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n").unwrap();
    std::fs::write(root.join("srv/old.txt"), "old").unwrap();
    run(Command::new("umoci")
        .args(["repack", "--image", &image])
        .arg(&bundle));
    // A fresh unpack, so the next repack is a layer on top of this one.
    std::fs::remove_dir_all(&bundle).unwrap();
    run(Command::new("umoci")
        .args(["unpack", "--image", &image])
        .arg(&bundle));
    std::fs::remove_file(root.join("srv/old.txt")).unwrap();
    std::fs::write(root.join("srv/new.txt"), "new").unwrap();
    run(Command::new("umoci")
        .args(["repack", "--image", &image])
        .arg(&bundle));
    run(Command::new("umoci").args([
        "config",
        "--image",
        &image,
        "--config.env",
        "GREETING=hello",
        "--config.workingdir",
        "/srv",
        "--config.user",
        "1000",
        "--config.cmd",
        "/bin/sh",
        "--os",
        "linux",
        "--architecture",
        "amd64",
    ]));
    run(Command::new("umoci").args(["gc", "--layout"]).arg(&layout));
    std::fs::remove_dir_all(&bundle).unwrap();
    layout
}

fn push(layout: &Path, dest: &str, extra: &[&str]) {
    run(Command::new("skopeo")
        .args(["copy", "--quiet", "--dest-tls-verify=false"])
        .args(extra)
        .arg(format!("oci:{}:tiny", layout.display()))
        .arg(dest));
}

fn quiet(_: ProgressEvent<'_>) {}

/// Adds to the layout an index tagged `tag` whose entries point to image
/// `tiny`'s manifest under each of `platforms` (`(os, arch)`), as a
/// multi-arch image lists one manifest per platform.
fn add_index(layout: &Path, tag: &str, platforms: &[(&str, &str)]) {
    use sha2::Digest;
    let index_path = layout.join("index.json");
    let mut index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&index_path).unwrap()).unwrap();
    let tiny = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == "tiny")
        .unwrap()
        .clone();
    let entries: Vec<serde_json::Value> = platforms
        .iter()
        .map(|(os, arch)| {
            serde_json::json!({
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": tiny["digest"], "size": tiny["size"],
                "platform": {"os": os, "architecture": arch},
            })
        })
        .collect();
    let blob = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": entries,
    }))
    .unwrap();
    let hex = hex::encode(sha2::Sha256::digest(&blob));
    std::fs::write(layout.join("blobs/sha256").join(&hex), &blob).unwrap();
    index["manifests"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "digest": format!("sha256:{hex}"), "size": blob.len(),
            "annotations": {"org.opencontainers.image.ref.name": tag},
        }));
    std::fs::write(&index_path, serde_json::to_vec(&index).unwrap()).unwrap();
}

fn check_unpacked(store: &BlobStore, layers: &[String], root: &Path) {
    unpack_layers(store, layers, root, &ImageLimits::DEFAULT).unwrap();
    assert_eq!(
        std::fs::read_to_string(root.join("srv/new.txt")).unwrap(),
        "new"
    );
    assert!(
        !root.join("srv/old.txt").exists(),
        "the whiteout was not applied"
    );
    assert!(root.join("bin/busybox").is_file());
}

#[tokio::test(flavor = "multi_thread")]
async fn pulls_oci_and_docker_manifests_once_and_reads_local_images() {
    let dir = tempfile::tempdir().unwrap();
    let layout = make_layout(dir.path());
    let reg = Registry::start(dir.path(), None);
    push(
        &layout,
        &format!("docker://{}:oci", reg.name("test/tiny")),
        &[],
    );
    push(
        &layout,
        &format!("docker://{}:v2s2", reg.name("test/tiny")),
        &["--format", "v2s2"],
    );
    let store = BlobStore::open(dir.path().join("cache")).unwrap();
    let opts = FetchOptions::default();

    let oci = ImageSource::parse(&format!("{}:oci", reg.name("test/tiny"))).unwrap();
    let first = fetch(&oci, &opts, &store, &quiet).await.unwrap();
    assert_eq!(first.layers.len(), 2);
    assert_eq!((first.fetched_layers, first.cached_layers), (2, 0));
    assert!(first
        .config
        .env
        .contains(&("GREETING".into(), "hello".into())));
    assert_eq!(first.config.workdir.as_deref(), Some("/srv"));
    assert_eq!(first.config.user.as_deref(), Some("1000"));
    assert_eq!(first.config.cmd, vec!["/bin/sh"]);
    check_unpacked(&store, &first.layers, &dir.path().join("root-oci"));

    let again = fetch(&oci, &opts, &store, &quiet).await.unwrap();
    assert_eq!(
        (again.fetched_layers, again.cached_layers),
        (0, 2),
        "layers pulled twice"
    );
    assert_eq!(again.digest, first.digest);

    let v2s2 = ImageSource::parse(&format!("{}:v2s2", reg.name("test/tiny"))).unwrap();
    let docker = fetch(&v2s2, &opts, &store, &quiet).await.unwrap();
    assert_eq!(docker.layers.len(), 2);
    assert_eq!(docker.config.workdir.as_deref(), Some("/srv"));
    check_unpacked(&store, &docker.layers, &dir.path().join("root-v2s2"));

    let local = ImageSource::parse(&format!("oci:{}:tiny", layout.display())).unwrap();
    let from_layout = fetch(&local, &opts, &store, &quiet).await.unwrap();
    assert_eq!(from_layout.layers, first.layers);

    let archive = dir.path().join("tiny.docker.tar");
    run(Command::new("skopeo")
        .args(["copy", "--quiet"])
        .arg(format!("oci:{}:tiny", layout.display()))
        .arg(format!(
            "docker-archive:{}:test/tiny:tiny",
            archive.display()
        )));
    let src = ImageSource::parse(&format!("docker-archive:{}", archive.display())).unwrap();
    let from_archive = fetch(&src, &opts, &store, &quiet).await.unwrap();
    assert_eq!(from_archive.config.user.as_deref(), Some("1000"));
    check_unpacked(
        &store,
        &from_archive.layers,
        &dir.path().join("root-archive"),
    );
    assert_eq!(
        std::fs::read_dir(store.dir().join("tmp")).unwrap().count(),
        0
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn multi_arch_indexes_give_their_linux_amd64_image() {
    let dir = tempfile::tempdir().unwrap();
    let layout = make_layout(dir.path());
    add_index(&layout, "multi", &[("linux", "arm64"), ("linux", "amd64")]);
    add_index(&layout, "armonly", &[("linux", "arm64")]);
    let reg = Registry::start(dir.path(), None);
    for tag in ["multi", "armonly"] {
        run(Command::new("skopeo")
            .args(["copy", "--quiet", "--all", "--dest-tls-verify=false"])
            .arg(format!("oci:{}:{tag}", layout.display()))
            .arg(format!("docker://{}:{tag}", reg.name("test/tiny"))));
    }
    let store = BlobStore::open(dir.path().join("cache")).unwrap();
    let opts = FetchOptions::default();
    for source in [
        format!("{}:multi", reg.name("test/tiny")),
        format!("oci:{}:multi", layout.display()),
    ] {
        let image = fetch(&ImageSource::parse(&source).unwrap(), &opts, &store, &quiet)
            .await
            .unwrap_or_else(|e| panic!("{source}: {e}"));
        assert_eq!(image.layers.len(), 2, "{source}");
        assert_eq!(image.config.workdir.as_deref(), Some("/srv"), "{source}");
    }
    for source in [
        format!("{}:armonly", reg.name("test/tiny")),
        format!("oci:{}:armonly", layout.display()),
    ] {
        let e = fetch(&ImageSource::parse(&source).unwrap(), &opts, &store, &quiet)
            .await
            .unwrap_err();
        assert!(matches!(e, ImageError::NoPlatform { .. }), "{source}: {e}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_sources_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let layout = make_layout(dir.path());
    let htpasswd = dir.path().join("htpasswd");
    run(Command::new("htpasswd")
        .args(["-Bbc"])
        .arg(&htpasswd)
        .args(["siesta", "right-password"]));
    let reg = Registry::start(dir.path(), Some(&htpasswd));
    let name = format!("{}:oci", reg.name("test/private"));
    push(
        &layout,
        &format!("docker://{name}"),
        &["--dest-creds", "siesta:right-password"],
    );
    let store = BlobStore::open(dir.path().join("cache")).unwrap();
    let src = ImageSource::parse(&name).unwrap();
    let with = |password: &str| FetchOptions {
        credentials: Some(Credentials {
            username: "siesta".into(),
            password: password.into(),
        }),
        ..Default::default()
    };

    let ok = fetch(&src, &with("right-password"), &store, &quiet)
        .await
        .unwrap();
    assert_eq!(ok.layers.len(), 2);
    let e = fetch(&src, &with("wrong"), &store, &quiet)
        .await
        .unwrap_err();
    assert!(matches!(e, ImageError::AuthFailed { .. }), "{e}");
    let e = fetch(&src, &FetchOptions::default(), &store, &quiet)
        .await
        .unwrap_err();
    assert!(matches!(e, ImageError::AuthFailed { .. }), "{e}");

    let missing = ImageSource::parse(&format!("{}:nope", reg.name("test/private"))).unwrap();
    let e = fetch(&missing, &with("right-password"), &store, &quiet)
        .await
        .unwrap_err();
    assert!(matches!(e, ImageError::NotFound { .. }), "{e}");
    assert!(e.to_string().contains("test/private:nope"), "{e}");

    let closed = ImageSource::parse(&format!("127.0.0.1:{}/x/y:z", free_port())).unwrap();
    let e = fetch(&closed, &FetchOptions::default(), &store, &quiet)
        .await
        .unwrap_err();
    assert!(matches!(e, ImageError::Unreachable { .. }), "{e}");

    let no_layout = ImageSource::parse("oci:/nonexistent/layout").unwrap();
    let e = fetch(&no_layout, &FetchOptions::default(), &store, &quiet)
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("/nonexistent/layout/index.json"),
        "{e}"
    );
    let untagged = ImageSource::parse(&format!("oci:{}:other", layout.display())).unwrap();
    let e = fetch(&untagged, &FetchOptions::default(), &store, &quiet)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("no image tagged `other`"), "{e}");
}

#[tokio::test(flavor = "multi_thread")]
async fn manifests_and_layers_over_the_limits_are_refused_before_they_are_pulled() {
    let dir = tempfile::tempdir().unwrap();
    let layout = make_layout(dir.path());
    let reg = Registry::start(dir.path(), None);
    push(
        &layout,
        &format!("docker://{}:oci", reg.name("test/tiny")),
        &[],
    );
    let store = BlobStore::open(dir.path().join("cache")).unwrap();
    let src = ImageSource::parse(&format!("{}:oci", reg.name("test/tiny"))).unwrap();
    let with = |limits: ImageLimits| FetchOptions {
        limits,
        ..Default::default()
    };

    let small_manifests = ImageLimits {
        max_manifest_bytes: 64,
        ..ImageLimits::DEFAULT
    };
    let e = fetch(&src, &with(small_manifests), &store, &quiet)
        .await
        .unwrap_err();
    assert!(matches!(e, ImageError::TooLarge { .. }), "{e}");
    assert!(
        e.to_string()
            .contains("manifest is over the limit of 64 bytes"),
        "{e}"
    );

    // busybox alone is over 100 KiB compressed.
    let small_layers = ImageLimits {
        max_layer_bytes: 100 << 10,
        ..ImageLimits::DEFAULT
    };
    let e = fetch(&src, &with(small_layers), &store, &quiet)
        .await
        .unwrap_err();
    assert!(matches!(e, ImageError::TooLarge { .. }), "{e}");
    assert!(
        e.to_string()
            .contains("over the limit of 102400 bytes on one layer"),
        "{e}"
    );
    let cached = std::fs::read_dir(store.dir().join("sha256"))
        .unwrap()
        .count();
    assert_eq!(cached, 0, "a refused layer was pulled");
    assert_eq!(
        std::fs::read_dir(store.dir().join("tmp")).unwrap().count(),
        0
    );
    fetch(&src, &FetchOptions::default(), &store, &quiet)
        .await
        .unwrap();
}
