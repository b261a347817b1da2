//! Helpers shared by the integration tests that make real namespaces:
//! skipping without root, names and subnets of their own, and a guard that
//! removes everything of a tag by exact name even when a test fails.
#![allow(dead_code)] // each test binary uses its own subset

use std::process::Command;

use siesta_net::{Subnet, Tag};

/// Whether a test that cannot run must fail rather than skip: under CI
/// and `make test` (which sets `SIESTA_TESTS_MUST_RUN`).
pub fn must_run() -> bool {
    std::env::var_os("CI").is_some() || std::env::var_os("SIESTA_TESTS_MUST_RUN").is_some()
}

pub fn skip_reason() -> Option<&'static str> {
    if !nix::unistd::geteuid().is_root() {
        return Some("needs root (network namespaces, nftables)");
    }
    for tool in ["ip", "nft"] {
        if Command::new(tool).arg("-V").output().is_err() {
            return Some("needs iproute2 and nftables installed");
        }
    }
    None
}

/// A tag of 6 letters unique to this process and test.
pub fn unique_tag(salt: u32) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let mut n = std::process::id().wrapping_mul(2_654_435_761) ^ nanos ^ salt.wrapping_mul(97);
    let mut tag = String::from("t");
    for _ in 0..5 {
        tag.push(char::from(b'a' + (n % 26) as u8));
        n /= 26;
    }
    tag
}

/// A /24 of 10.251.0.0/16 picked from the tag, away from the default /16;
/// `salt` (one per test) keeps the tests of one run on different /24s (a
/// pool refuses a subnet another instance's slots are in).
pub fn test_subnet(tag: &str, salt: u8) -> Subnet {
    let hash = tag
        .bytes()
        .fold(7u8, |a, b| a.wrapping_mul(31).wrapping_add(b));
    let third = (hash & !3) | (salt & 3);
    format!("10.251.{third}.0/24")
        .parse()
        .expect("valid subnet")
}

pub fn sh(args: &[&str]) -> (bool, String) {
    match Command::new(args[0]).args(&args[1..]).output() {
        Ok(o) => (
            o.status.success(),
            String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr),
        ),
        Err(e) => (false, e.to_string()),
    }
}

pub fn ok(args: &[&str]) -> String {
    let (success, out) = sh(args);
    assert!(success, "{args:?} failed: {out}");
    out
}

/// Removes every name a pool with this tag could create, by exact name.
pub struct Guard {
    pub tag: Tag,
    pub capacity: usize,
    pub extra_netns: Vec<String>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        for i in 0..self.capacity {
            let veth = self.tag.host_veth(i);
            if std::path::Path::new("/sys/class/net").join(&veth).exists() {
                sh(&["ip", "link", "del", &veth]);
            }
            for ns in [self.tag.guest_netns_name(i), self.tag.netns_name(i)] {
                if std::path::Path::new("/run/netns").join(&ns).exists() {
                    sh(&["ip", "netns", "del", &ns]);
                }
            }
        }
        for ns in &self.extra_netns {
            if std::path::Path::new("/run/netns").join(ns).exists() {
                sh(&["ip", "netns", "del", ns]);
            }
        }
        let table = self.tag.root_table();
        let script = format!("table ip {table}\ndelete table ip {table}\n");
        let _ = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "printf '{}' | nft -f -",
                script.replace('\n', "\\n")
            ))
            .status();
    }
}
