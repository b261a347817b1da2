//! `GET /templates`, and the template model the other template routes share.

use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};
use siesta_template::Template;

use super::AppState;
use crate::error::ApiError;

/// The templates on this node, as E2B's `Template`.
#[utoipa::path(
    get, path = "/templates", tag = "templates",
    responses((status = 200, description = "`[{templateID, buildID, aliases, names, cpuCount, memoryMB, diskSizeMB, ...}]`", body = [Object])),
)]
pub async fn list(State(st): State<AppState>) -> Result<Json<Vec<Value>>, ApiError> {
    let layout = st.manager.node().config.layout();
    let all = tokio::task::spawn_blocking(move || siesta_template::list(&layout))
        .await
        .map_err(|e| {
            ApiError::new(axum::http::StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
        })??;
    Ok(Json(all.iter().map(describe).collect()))
}

/// E2B's `Template` model of `t`. Its id is its name; a template holds one
/// build, the one that made it.
pub fn describe(t: &Template) -> Value {
    let r = &t.record;
    let build_id = super::template_tags::build_id_of(t);
    json!({
        "templateID": r.name,
        "buildID": build_id,
        "aliases": [r.name],
        "names": [r.name],
        "cpuCount": r.vcpus,
        "memoryMB": r.memory_mib,
        "diskSizeMB": r.disk.size >> 20,
        "public": false,
        "createdAt": r.created_at,
        "updatedAt": r.created_at,
        "createdBy": null,
        "lastSpawnedAt": null,
        "spawnCount": 0,
        "buildCount": 1,
        "envdVersion": siesta_envd_proto::ENVD_VERSION,
        "buildStatus": "ready",
    })
}
