//! Store tests: rows round-trip, filters, metadata, ordering, pagination.

use std::collections::HashMap;

use chrono::{DateTime, Duration, TimeZone, Utc};

use super::*;
use crate::sandbox::{GuestDefaults, Lifecycle, OnTimeout, SandboxRecord, SandboxState};
use crate::stages::StageTimings;

fn t(secs: i64) -> DateTime<Utc> {
    Utc.timestamp_opt(1_700_000_000 + secs, 0).unwrap()
}

fn rec(id: &str, started: i64, state: SandboxState, meta: &[(&str, &str)]) -> SandboxRecord {
    SandboxRecord {
        id: id.into(),
        template: "base".into(),
        state,
        created_at: t(started),
        started_at: t(started),
        end_at: t(started + 300),
        access_token: format!("tok-{id}"),
        env_vars: HashMap::from([("FOO".to_string(), "bar baz".to_string())]),
        metadata: meta
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        egress: Default::default(),
        traffic_token: Some(format!("traffic-{id}")),
        cpu_count: 2,
        memory_mb: 512,
        disk_size_mb: 2048,
        lifecycle: Lifecycle::default(),
        agent_addr: None,
        vmm_pid: None,
        timings: None,
        dead_reason: None,
        guest_defaults: GuestDefaults {
            user: format!("u-{id}"),
            workdir: "/srv".into(),
        },
        volume_mounts: vec![crate::volumes::VolumeMount {
            volume_id: format!("vol-{id}"),
            name: "data".into(),
            path: "/mnt/data".into(),
        }],
        paused_disk_only: true,
    }
}

/// Records compare through JSON (stage timings have no `PartialEq`).
fn same(a: &SandboxRecord, b: &SandboxRecord) -> bool {
    serde_json::to_value(a).unwrap() == serde_json::to_value(b).unwrap()
}

fn ids(rows: &[SandboxRecord]) -> Vec<&str> {
    rows.iter().map(|r| r.id.as_str()).collect()
}

fn filled() -> Store {
    let s = Store::in_memory().unwrap();
    s.put(&rec(
        "a",
        10,
        SandboxState::Running,
        &[("team", "x"), ("k", "1")],
    ))
    .unwrap();
    s.put(&rec("b", 20, SandboxState::Paused, &[("team", "x")]))
        .unwrap();
    s.put(&rec("c", 30, SandboxState::Dead, &[("team", "y")]))
        .unwrap();
    let mut d = rec("d", 20, SandboxState::Running, &[]);
    d.template = "other".into();
    s.put(&d).unwrap();
    s
}

#[test]
fn a_record_round_trips_with_every_field() {
    let s = Store::in_memory().unwrap();
    let mut r = rec("x1", 5, SandboxState::Running, &[("a b", "c=d&e")]);
    r.agent_addr = Some("10.0.0.2:49983".parse().unwrap());
    r.vmm_pid = Some(4242);
    r.timings = Some(StageTimings::default());
    r.lifecycle = Lifecycle {
        on_timeout: OnTimeout::Kill,
        auto_resume: true,
        filesystem_only: true,
    };
    r.end_at += Duration::microseconds(7);
    r.egress = siesta_net::EgressPolicy {
        allow_internet: false,
        allow_out: vec!["10.1.0.0/16".parse().unwrap()],
        deny_out: vec!["10.1.2.3".parse().unwrap()],
        allow_domains: vec!["*.example.com".parse().unwrap()],
    };
    s.put(&r).unwrap();
    assert!(same(&s.get("x1").unwrap().unwrap(), &r));
    // Overwriting replaces the metadata as a whole.
    r.metadata = HashMap::from([("new".into(), "v".into())]);
    r.state = SandboxState::Dead;
    r.dead_reason = Some("VMM exited".into());
    s.put(&r).unwrap();
    assert!(same(&s.get("x1").unwrap().unwrap(), &r));
    assert!(s.get("nope").unwrap().is_none());
    assert!(s.delete("x1").unwrap());
    assert!(!s.delete("x1").unwrap());
    assert!(s.get("x1").unwrap().is_none());
}

#[test]
fn filters_by_state_template_and_start() {
    let s = filled();
    let q = |q: ListQuery| ids(&s.list(&q).unwrap().0).join(",");
    assert_eq!(q(ListQuery::default()), "a,b,d,c");
    let running_paused = ListQuery {
        states: vec![SandboxState::Running, SandboxState::Paused],
        ..Default::default()
    };
    assert_eq!(q(running_paused), "a,b,d");
    let dead = ListQuery {
        states: vec![SandboxState::Dead],
        ..Default::default()
    };
    assert_eq!(q(dead), "c");
    let other = ListQuery {
        template: Some("other".into()),
        ..Default::default()
    };
    assert_eq!(q(other), "d");
    let at = ListQuery {
        started_after: Some(t(10)),
        ..Default::default()
    };
    assert_eq!(q(at), "a,b,d,c", "a sandbox's own start time finds it");
    let after = ListQuery {
        started_after: Some(t(11)),
        ..Default::default()
    };
    assert_eq!(q(after), "b,d,c");
}

#[test]
fn metadata_filters_need_every_pair() {
    let s = filled();
    let q = |pairs: &[(&str, &str)]| {
        let query = ListQuery {
            metadata: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        };
        ids(&s.list(&query).unwrap().0).join(",")
    };
    assert_eq!(q(&[("team", "x")]), "a,b");
    assert_eq!(q(&[("team", "x"), ("k", "1")]), "a");
    assert_eq!(q(&[("team", "x"), ("k", "2")]), "");
    assert_eq!(q(&[("nobody", "x")]), "");
    // Values are bound, never spliced into SQL.
    assert_eq!(q(&[("team", "x' OR '1'='1")]), "");
}

#[test]
fn orders_by_start_then_id_both_ways() {
    let s = filled();
    let desc = ListQuery {
        order: SortOrder::Desc,
        ..Default::default()
    };
    assert_eq!(ids(&s.list(&desc).unwrap().0), ["c", "d", "b", "a"]);
}

#[test]
fn pages_follow_the_cursor_without_repeats_or_gaps() {
    let s = Store::in_memory().unwrap();
    // Ties on the start time exercise the id tie-break.
    for i in 0..7 {
        s.put(&rec(&format!("s{i}"), i / 2, SandboxState::Running, &[]))
            .unwrap();
    }
    for order in [SortOrder::Asc, SortOrder::Desc] {
        let mut seen = Vec::new();
        let mut token = None;
        let mut pages = 0;
        loop {
            let q = ListQuery {
                order,
                limit: Some(3),
                next_token: token.clone(),
                ..Default::default()
            };
            let (rows, next) = s.list(&q).unwrap();
            assert!(rows.len() <= 3);
            seen.extend(rows.iter().map(|r| r.id.clone()));
            pages += 1;
            match next {
                Some(n) => token = Some(n),
                None => break,
            }
        }
        assert_eq!(pages, 3);
        let mut want: Vec<String> = (0..7).map(|i| format!("s{i}")).collect();
        if order == SortOrder::Desc {
            want.reverse();
        }
        assert_eq!(seen, want, "{order:?}");
    }
    // An exact last page has no next token.
    let q = ListQuery {
        limit: Some(7),
        ..Default::default()
    };
    assert_eq!(s.list(&q).unwrap().1, None);
}

#[test]
fn a_page_skips_rows_removed_since_the_last_one() {
    let s = filled();
    let first = ListQuery {
        limit: Some(2),
        ..Default::default()
    };
    let (rows, next) = s.list(&first).unwrap();
    assert_eq!(ids(&rows), ["a", "b"]);
    s.delete("d").unwrap();
    let rest = ListQuery {
        next_token: next,
        ..Default::default()
    };
    assert_eq!(ids(&s.list(&rest).unwrap().0), ["c"]);
}

#[test]
fn a_bad_cursor_is_a_typed_error() {
    let s = filled();
    let q = ListQuery {
        next_token: Some("garbage!".into()),
        ..Default::default()
    };
    assert!(matches!(s.list(&q), Err(StoreError::BadCursor(_))));
}

#[test]
fn expired_lists_only_running_sandboxes_past_their_deadline() {
    let s = filled();
    // a: running, ends t(310); b paused ends t(320); d running ends t(320).
    assert!(s.expired(t(309)).unwrap().is_empty());
    assert_eq!(s.expired(t(310)).unwrap(), ["a"]);
    assert_eq!(s.expired(t(1000)).unwrap(), ["a", "d"]);
}

#[test]
fn committed_rows_survive_reopening_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(DB_FILE);
    {
        let s = Store::open(&path).unwrap();
        s.put(&rec("p", 1, SandboxState::Paused, &[("k", "v")]))
            .unwrap();
    }
    let s = Store::open(&path).unwrap();
    let all = s.all().unwrap();
    assert_eq!(ids(&all), ["p"]);
    assert_eq!(all[0].metadata.get("k").map(String::as_str), Some("v"));
}

#[test]
fn counts_cover_every_row_not_a_page() {
    let s = Store::in_memory().unwrap();
    let n = crate::store::MAX_LIMIT as usize + 5;
    for i in 0..n {
        let state = if i % 3 == 0 {
            SandboxState::Paused
        } else {
            SandboxState::Running
        };
        s.put(&rec(&format!("sb{i:05}"), i as i64, state, &[]))
            .unwrap();
    }
    let running = s.count(SandboxState::Running).unwrap();
    let paused = s.count(SandboxState::Paused).unwrap();
    assert_eq!(running + paused, n as u64);
    assert_eq!(paused, n.div_ceil(3) as u64);
    assert_eq!(s.count(SandboxState::Dead).unwrap(), 0);
}

#[test]
fn live_tokens_follow_every_write_and_survive_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(DB_FILE);
    let tokens = |s: &Store| {
        let mut all = s.live_tokens();
        all.sort();
        all
    };
    let pair = |id: &str| (id.to_string(), format!("tok-{id}"));
    {
        let s = Store::open(&path).unwrap();
        s.put(&rec("r", 1, SandboxState::Running, &[])).unwrap();
        s.put(&rec("p", 2, SandboxState::Paused, &[])).unwrap();
        s.put(&rec("d", 3, SandboxState::Dead, &[])).unwrap();
        s.put(&rec("gone", 4, SandboxState::Running, &[])).unwrap();
        assert_eq!(tokens(&s), [pair("gone"), pair("p"), pair("r")]);
        // Killed, then deleted: out of the index as out of the table.
        s.put(&rec("r", 1, SandboxState::Dead, &[])).unwrap();
        s.delete("gone").unwrap();
        assert_eq!(tokens(&s), [pair("p")]);
    }
    let s = Store::open(&path).unwrap();
    assert_eq!(tokens(&s), [pair("p")], "rebuilt from the rows on open");
}
