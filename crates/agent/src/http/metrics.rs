//! `GET /metrics`: the guest's own CPU, memory and disk use, as envd reports
//! it (`{ts, cpu_count, cpu_used_pct, mem_total, mem_used, mem_cache,
//! disk_used, disk_total}`; bytes). The control API's sandbox metrics come
//! from here.

use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use serde::Serialize;

use super::HttpError;
use crate::auth::check_access_token;
use crate::state::AgentState;

#[derive(Debug, Serialize)]
pub struct Metrics {
    pub ts: i64,
    pub cpu_count: u32,
    pub cpu_used_pct: f64,
    pub mem_total: u64,
    pub mem_used: u64,
    pub mem_cache: u64,
    pub disk_used: u64,
    pub disk_total: u64,
}

pub async fn metrics(
    State(state): State<AgentState>,
    headers: HeaderMap,
) -> Result<Json<Metrics>, HttpError> {
    check_access_token(&state, &headers)
        .await
        .map_err(HttpError::from_rpc)?;
    // CPU use is the busy share of two /proc/stat samples 100 ms apart.
    let first = read_cpu_times()?;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let second = read_cpu_times()?;
    let meminfo = std::fs::read_to_string("/proc/meminfo")
        .map_err(|e| HttpError::from_io(&e, "/proc/meminfo".as_ref()))?;
    let (mem_total, mem_used, mem_cache) = memory_from_meminfo(&meminfo);
    let (disk_total, disk_used) = disk_usage("/")?;
    Ok(Json(Metrics {
        ts: chrono_now_secs(),
        cpu_count: std::thread::available_parallelism().map_or(1, |n| n.get() as u32),
        cpu_used_pct: busy_pct(first, second),
        mem_total,
        mem_used,
        mem_cache,
        disk_used,
        disk_total,
    }))
}

fn chrono_now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// (busy, total) jiffies of the aggregate `cpu` line.
fn read_cpu_times() -> Result<(u64, u64), HttpError> {
    let stat = std::fs::read_to_string("/proc/stat")
        .map_err(|e| HttpError::from_io(&e, "/proc/stat".as_ref()))?;
    Ok(cpu_times_from_stat(&stat))
}

fn cpu_times_from_stat(stat: &str) -> (u64, u64) {
    let fields: Vec<u64> = stat
        .lines()
        .find(|l| l.starts_with("cpu "))
        .map(|l| {
            l.split_whitespace()
                .skip(1)
                .filter_map(|v| v.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    let total: u64 = fields.iter().sum();
    // idle and iowait are the 4th and 5th values.
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    (total.saturating_sub(idle), total)
}

fn busy_pct(a: (u64, u64), b: (u64, u64)) -> f64 {
    let total = b.1.saturating_sub(a.1);
    if total == 0 {
        return 0.0;
    }
    100.0 * b.0.saturating_sub(a.0) as f64 / total as f64
}

/// (total, used, cache) in bytes; used excludes buffers and page cache.
fn memory_from_meminfo(meminfo: &str) -> (u64, u64, u64) {
    let kib = |key: &str| {
        meminfo
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    let total = kib("MemTotal:");
    let cache = kib("Cached:") + kib("Buffers:");
    let used = total.saturating_sub(kib("MemFree:")).saturating_sub(cache);
    (total, used, cache)
}

fn disk_usage(path: &str) -> Result<(u64, u64), HttpError> {
    let st = nix::sys::statvfs::statvfs(path).map_err(|e| {
        HttpError::from_io(&std::io::Error::from_raw_os_error(e as i32), path.as_ref())
    })?;
    let block = st.fragment_size() as u64;
    let total = st.blocks() as u64 * block;
    let free = st.blocks_free() as u64 * block;
    Ok((total, total.saturating_sub(free)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_files() {
        let (busy, total) = cpu_times_from_stat("cpu  10 0 10 70 10 0 0 0 0 0\ncpu0 1 1 1 1 1\n");
        assert_eq!((busy, total), (20, 100));
        assert_eq!(busy_pct((0, 0), (20, 100)), 20.0);
        assert_eq!(busy_pct((5, 5), (5, 5)), 0.0);
        let m = "MemTotal: 1000 kB\nMemFree: 200 kB\nBuffers: 100 kB\nCached: 300 kB\n";
        assert_eq!(memory_from_meminfo(m), (1_024_000, 409_600, 409_600));
    }

    #[test]
    fn root_disk_usage_is_plausible() {
        let (total, used) = disk_usage("/").unwrap();
        assert!(total > 0 && used <= total);
    }
}
