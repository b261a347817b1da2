//! `GET /templates`.

use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};

use super::AppState;
use crate::error::ApiError;

pub async fn list(State(st): State<AppState>) -> Result<Json<Vec<Value>>, ApiError> {
    let layout = st.manager.node().config.layout();
    let all = siesta_sandbox::template::list(&layout)?;
    Ok(Json(
        all.iter()
            .map(|t| {
                json!({
                    "templateID": t.record.name,
                    "buildID": t.record.name,
                    "aliases": [t.record.name],
                    "names": [t.record.name],
                    "cpuCount": t.record.vcpus,
                    "memoryMB": t.record.memory_mib,
                    "diskSizeMB": t.record.disk.size >> 20,
                    "public": false,
                    "createdAt": t.record.created_at,
                    "updatedAt": t.record.created_at,
                    "buildStatus": "ready",
                })
            })
            .collect(),
    ))
}
