//! Sandbox metrics as E2B's API has them: `GET /sandboxes/{id}/metrics`
//! (a time range of one sandbox's samples) and `GET
//! /sandboxes/metrics?sandbox_ids=` (the latest sample of several).
//!
//! Samples are taken from the guest agent when asked for and kept in
//! memory (`crate::sandbox_metrics`, an hour per sandbox).

use std::collections::BTreeMap;

use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::Json;
use serde_json::Value;
use siesta_sandbox::sandbox::SandboxState;

use super::AppState;
use crate::error::ApiError;
use crate::sandbox_metrics::Sample;

/// Most sandboxes one batch call names.
const MAX_BATCH: usize = 100;

/// `SandboxMetric`s of `id` with `start <= time <= end` (Unix seconds,
/// both optional); a range that reaches the present gets a sample taken
/// now from a running sandbox.
#[utoipa::path(
    get, path = "/sandboxes/{id}/metrics", tag = "sandboxes", operation_id = "metrics",
    params(("id" = String, Path, description = "the sandbox's id"),
        ("start" = Option<i64>, Query, description = "Unix seconds"),
        ("end" = Option<i64>, Query, description = "Unix seconds")),
    responses(
        (status = 200, description = "E2B's `SandboxMetric` samples, oldest first", body = [Object]),
        (status = 400, description = "a bad time", body = super::model::Error),
        (status = 404, description = "no such sandbox", body = super::model::Error),
    ),
)]
pub async fn one(
    State(st): State<AppState>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Json<Vec<Value>>, ApiError> {
    let (mut start, mut end) = (None, None);
    for (k, v) in form_urlencoded::parse(raw.unwrap_or_default().as_bytes()) {
        if k == "start" || k == "end" {
            let t = v.parse::<i64>().map_err(|_| {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    format!("{k}={v:?} is not a Unix time in seconds"),
                )
            })?;
            if k == "start" {
                start = Some(t);
            } else {
                end = Some(t);
            }
        }
    }
    let info = st.manager.get(&id).await?;
    let now = chrono::Utc::now().timestamp();
    if info.state == SandboxState::Running && end.is_none_or(|e| e >= now - 1) {
        // Filed under `end` when taken in the second after it (the query's
        // precision), so a range ending "now" includes it.
        sample_now(&st, &id, end.map_or(now, |e| now.min(e))).await?;
    }
    let samples = st.sandbox_metrics.range(&id, start, end);
    Ok(Json(samples.into_iter().map(|s| s.value).collect()))
}

/// `{"sandboxes": {id: SandboxMetric}}`: the latest sample of each named
/// sandbox (taken now for a running one). Sandboxes that do not exist, or
/// have never been sampled, are left out.
#[utoipa::path(
    get, path = "/sandboxes/metrics", tag = "sandboxes", operation_id = "metrics_of_several",
    params(("sandbox_ids" = String, Query, description = "comma-separated sandbox ids (1-100)")),
    responses(
        (status = 200, description = "`{sandboxes: {id: SandboxMetric}}`", body = Object),
        (status = 400, description = "none or too many ids", body = super::model::Error),
    ),
)]
pub async fn many(
    State(st): State<AppState>,
    RawQuery(raw): RawQuery,
) -> Result<Json<Value>, ApiError> {
    let mut ids: Vec<String> = Vec::new();
    for (k, v) in form_urlencoded::parse(raw.unwrap_or_default().as_bytes()) {
        if k == "sandbox_ids" {
            ids.extend(
                v.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(String::from),
            );
        }
    }
    if ids.is_empty() || ids.len() > MAX_BATCH {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("sandbox_ids: give 1 to {MAX_BATCH} comma-separated sandbox ids"),
        ));
    }
    ids.sort();
    ids.dedup();
    let now = chrono::Utc::now().timestamp();
    let mut out = BTreeMap::new();
    for id in ids {
        let Ok(info) = st.manager.get(&id).await else {
            continue;
        };
        if info.state == SandboxState::Running {
            if let Err(e) = sample_now(&st, &id, now).await {
                tracing::debug!(sandbox = %id, "metrics sample: {}", e.message);
            }
        }
        if let Some(latest) = st.sandbox_metrics.range(&id, None, None).pop() {
            out.insert(id, latest.value);
        }
    }
    Ok(Json(serde_json::json!({ "sandboxes": out })))
}

/// Asks running sandbox `id`'s agent for a sample and keeps it under `at`.
async fn sample_now(st: &AppState, id: &str, at: i64) -> Result<(), ApiError> {
    let m = st
        .manager
        .envd(id)
        .await?
        .metrics()
        .await
        .map_err(siesta_sandbox::Error::from)?;
    st.sandbox_metrics.record(
        id,
        Sample {
            unix: at,
            value: metric_row(&m, at),
        },
    );
    Ok(())
}

/// One `SandboxMetric` from what the guest's agent answered. Only numbers
/// are kept (anything else reads 0): the guest chooses the answer, and a
/// row kept for an hour must not hold whatever it sent (review M5).
fn metric_row(m: &Value, at: i64) -> Value {
    let pick = |k: &str| {
        m.get(k)
            .filter(|v| v.is_number())
            .cloned()
            .unwrap_or(Value::from(0))
    };
    let at_time = chrono::DateTime::from_timestamp(at, 0).unwrap_or_default();
    serde_json::json!({
        "timestamp": at_time,
        "timestampUnix": at,
        "cpuCount": pick("cpu_count"),
        "cpuUsedPct": pick("cpu_used_pct"),
        "memUsed": pick("mem_used"),
        "memTotal": pick("mem_total"),
        "memCache": pick("mem_cache"),
        "diskUsed": pick("disk_used"),
        "diskTotal": pick("disk_total"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_keeps_numbers_and_nothing_else_the_guest_sent() {
        let answer = serde_json::json!({
            "cpu_count": 2,
            "cpu_used_pct": 12.5,
            "mem_used": "x".repeat(1 << 20),
            "mem_total": { "nested": [1, 2, 3] },
            "disk_used": 4096,
            "extra": "y".repeat(1 << 20),
        });
        let row = metric_row(&answer, 1_700_000_000);
        assert_eq!(row["cpuCount"], 2);
        assert_eq!(row["cpuUsedPct"], 12.5);
        assert_eq!(row["memUsed"], 0);
        assert_eq!(row["memTotal"], 0);
        assert_eq!(row["memCache"], 0);
        assert_eq!(row["diskUsed"], 4096);
        assert_eq!(row["timestampUnix"], 1_700_000_000);
        assert!(row.to_string().len() < 512, "{row}");
    }
}
