//! A publisher killed at every step of publication leaves a repository that
//! `repair` makes consistent: the snapshot is either whole or absent, and
//! nothing of it is left behind.
//!
//! The crash is real: the test binary re-runs itself as a child whose
//! publish hook calls `abort()` at the chosen step, so the process dies with
//! its files, lock and flock exactly as they were.

mod common;

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use siesta_snapshot::repo::PublishStep;
use siesta_snapshot::{RepoError, Repository};

const STEP_ENV: &str = "SIESTA_TEST_CRASH_STEP";
const REPO_ENV: &str = "SIESTA_TEST_CRASH_REPO";

/// The child: publishes `victim` and aborts at the step named in the
/// environment. Ignored, so it is not counted as a test that passed: the
/// test below runs it with `--ignored`.
#[test]
#[ignore = "the crash test's child process, run by crash_at_every_publish_step_is_repaired"]
fn crash_child() {
    let (Ok(step), Ok(root)) = (std::env::var(STEP_ENV), std::env::var(REPO_ENV)) else {
        return;
    };
    let at = PublishStep::ALL
        .into_iter()
        .find(|s| format!("{s:?}") == step)
        .expect("known step");
    let repo = Repository::open(&root)
        .unwrap()
        .with_publish_hook(Arc::new(move |s| {
            if s == at {
                std::process::abort();
            }
            Ok(())
        }));
    let dir = std::path::Path::new(&root).parent().unwrap().to_path_buf();
    let (mem, state) = sources(&dir, "victim", 9);
    let _ = repo.publish(request("victim", &mem, &state));
    unreachable!("the hook aborts at {step}");
}

#[test]
fn crash_at_every_publish_step_is_repaired() {
    for step in PublishStep::ALL {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("repo");
        let repo = Repository::open(&root).unwrap();
        let (mem, state) = sources(tmp.path(), "base", 1);
        let base = repo.publish(request("base", &mem, &state)).unwrap();

        let status = Command::new(std::env::current_exe().unwrap())
            .args([
                "crash_child",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(STEP_ENV, format!("{step:?}"))
            .env(REPO_ENV, &root)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(!status.success(), "child must die at {step:?}");

        repo.repair(Duration::from_secs(5)).unwrap();
        let after = repo.check().unwrap();
        assert!(after.is_clean(), "{step:?}: {:?}", after.issues);

        match repo.get("victim") {
            Ok(v) => {
                assert!(
                    step >= PublishStep::Committed,
                    "{step:?}: visible too early"
                );
                for role in ["memory", "state"] {
                    assert!(
                        repo.file_path(&v, role).unwrap().exists(),
                        "{step:?} {role}"
                    );
                }
                // Its lock (left by the dead child) does not block a delete.
                repo.delete("victim").unwrap();
            }
            Err(RepoError::NotFound(_)) => {
                assert!(
                    step < PublishStep::Committed,
                    "{step:?}: committed but lost"
                );
                assert!(!repo.snapshot_dir("victim").exists());
                // The id is free: publishing it now works.
                let (m, s) = sources(tmp.path(), "victim", 9);
                repo.publish(request("victim", &m, &s)).unwrap();
            }
            Err(e) => panic!("{step:?}: {e}"),
        }
        assert_eq!(repo.get("base").unwrap(), base, "{step:?}: base damaged");
        assert!(repo.file_path(&base, "memory").unwrap().exists());
        assert!(repo.check().unwrap().is_clean());
    }
}
