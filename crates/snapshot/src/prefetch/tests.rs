use super::*;

const PS: u64 = 4096;

fn setup(pages: u64) -> (tempfile::TempDir, PathBuf, Arc<Manifest>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("memory.img");
    std::fs::write(&path, vec![7u8; (pages * PS) as usize]).unwrap();
    // Every other page, in reverse order: many runs, many chunks.
    let order: Vec<u64> = (0..pages).rev().step_by(2).collect();
    let m = Manifest::from_touch_order(PS as u32, pages * PS, &order);
    (dir, path, Arc::new(m))
}

fn slow() -> Prefetcher {
    Prefetcher::new(PrefetchConfig {
        readers: 4,
        buffer_bytes: PS as usize,
        chunk_delay: Some(Duration::from_millis(5)),
    })
}

#[test]
fn chunks_follow_first_touch_order_and_split_at_buffer_size() {
    let m = Manifest::from_touch_order(4096, 1 << 20, &[10, 11, 12, 1]);
    assert_eq!(
        chunks(&m, 8192),
        vec![(40960, 8192), (49152, 4096), (4096, 4096)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_every_range() {
    let (_d, path, m) = setup(64);
    let p = Prefetcher::default();
    let h = p.start(&path, Arc::clone(&m), "x").unwrap();
    let out = h.wait().await;
    assert!(out.completed, "{out:?}");
    assert_eq!(out.bytes, m.total_bytes());
    assert_eq!(out.error, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_users_share_one_prefetch_and_one_cancelling_does_not_stop_it() {
    let (_d, path, m) = setup(64);
    let p = slow();
    let a = p.start(&path, Arc::clone(&m), "digest").unwrap();
    let b = p.start(&path, Arc::clone(&m), "digest").unwrap();
    assert!(!a.joined());
    assert!(
        b.joined(),
        "the second resume joins the first one's prefetch"
    );
    assert_eq!(p.in_flight(), 1);
    drop(a); // the first resume gives up
    let out = b.wait().await;
    assert!(out.completed, "still needed by b: {out:?}");
    assert_eq!(out.chunks, 32);
    assert_eq!(out.bytes, m.total_bytes());
    // Once done, a new resume starts a fresh prefetch.
    drop(b);
    let c = p.start(&path, Arc::clone(&m), "digest").unwrap();
    assert!(!c.joined());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn last_user_leaving_cancels() {
    let (_d, path, m) = setup(64);
    let p = slow();
    let a = p.start(&path, Arc::clone(&m), "digest").unwrap();
    let b = p.start(&path, Arc::clone(&m), "digest").unwrap();
    let watch = a.watch();
    drop(a);
    drop(b);
    let out = watch.wait().await;
    assert!(!out.completed, "nobody needed it: {out:?}");
    assert!(out.chunks < 32);
    assert_eq!(p.in_flight(), 0);
    // A new resume does not join the cancelled one.
    let c = p.start(&path, Arc::clone(&m), "digest").unwrap();
    assert!(!c.joined());
    assert!(c.wait().await.completed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn different_manifests_do_not_share() {
    let (_d, path, m) = setup(16);
    let p = slow();
    let a = p.start(&path, Arc::clone(&m), "one").unwrap();
    let b = p.start(&path, Arc::clone(&m), "two").unwrap();
    assert!(!b.joined());
    assert!(a.wait().await.completed && b.wait().await.completed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_range_beyond_the_file_reads_short_without_error() {
    let (_d, path, _) = setup(4);
    let m = Arc::new(Manifest::from_touch_order(4096, 64 * 4096, &[2, 3, 40]));
    let out = Prefetcher::default()
        .start(&path, m, "d")
        .unwrap()
        .wait()
        .await;
    assert!(out.completed);
    assert_eq!(out.bytes, 2 * 4096);
}
