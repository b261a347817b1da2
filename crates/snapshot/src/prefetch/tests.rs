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
        pad_bytes: 0,
        chunk_delay: Some(Duration::from_millis(5)),
    })
}

#[test]
fn chunks_follow_first_touch_order_and_split_at_buffer_size() {
    let m = Manifest::from_touch_order(4096, 1 << 20, &[10, 11, 12, 1]);
    assert_eq!(
        chunks(&m, 8192, 0),
        vec![(40960, 8192), (49152, 4096), (4096, 4096)]
    );
}

#[test]
fn padding_widens_runs_to_aligned_blocks_once_each() {
    // Pages 10-12 then 1, padded to 4 pages: blocks 2 and 3 (pages 8-15),
    // then block 0 (pages 0-3); the memory ends at page 14.
    let m = Manifest::from_touch_order(4096, 14 * 4096, &[10, 11, 12, 1, 9]);
    assert_eq!(
        chunks(&m, 1 << 20, 4 * 4096),
        vec![(8 * 4096, 6 * 4096), (0, 4 * 4096)]
    );
    // A pad that is not a page multiple is ignored.
    assert_eq!(chunks(&m, 1 << 20, 1000), chunks(&m, 1 << 20, 0));
}

/// Drops `path`'s pages from the page cache; false where the file system
/// keeps them anyway (tmpfs).
fn make_cold(path: &Path) -> bool {
    use std::os::unix::io::AsRawFd;
    let f = std::fs::File::open(path).unwrap();
    f.sync_all().unwrap();
    // SAFETY: fadvise on a descriptor we own.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    let map = Residency::map(&f).unwrap().unwrap();
    map.count(0, map.len() as u64).unwrap().0 == 0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_every_range_and_skips_what_is_cached() {
    let (_d, path, m) = setup(64);
    let p = Prefetcher::default();
    // Just written: every chunk is resident, nothing is read.
    let out = p.start(&path, Arc::clone(&m), "x").unwrap().wait().await;
    assert!(out.completed, "{out:?}");
    assert_eq!(out.bytes, m.total_bytes());
    assert_eq!(out.resident_bytes, m.total_bytes());
    assert_eq!(out.error, None);

    if make_cold(&path) {
        let out = p.start(&path, Arc::clone(&m), "x").unwrap().wait().await;
        assert!(out.completed, "{out:?}");
        assert_eq!(out.bytes, m.total_bytes());
        assert!(out.resident_bytes < m.total_bytes(), "{out:?}");
        let f = std::fs::File::open(&path).unwrap();
        let map = Residency::map(&f).unwrap().unwrap();
        for r in &m.runs {
            assert!(map.all_resident(r.offset, r.end() - r.offset));
        }
    }
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
