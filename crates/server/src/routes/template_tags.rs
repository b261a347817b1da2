//! Template tags: `POST /templates/tags`, `DELETE /templates/tags`,
//! `GET /templates/{id}/tags` (`siesta_template::tags`).

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use siesta_template::{self as template, tags, Template};

use super::template_builds::template_name;
use super::{body, AppState};
use crate::error::ApiError;

/// A tag as sent: `tag`, or `name:tag` with both parts present.
fn tag_part(raw: &str) -> Result<String, ApiError> {
    let bad = || {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("invalid tag {raw:?}: use TAG or NAME:TAG"),
        )
    };
    let tag = match raw.split_once(':') {
        Some((name, tag)) if !name.is_empty() && !tag.is_empty() => tag,
        Some(_) => return Err(bad()),
        None => raw,
    };
    tags::validate_tag(tag).map_err(|_| bad())?;
    Ok(tag.to_string())
}

/// The build a template name resolves to now.
fn current_build(st: &AppState, name: &str) -> Result<String, ApiError> {
    let t = Template::open(&st.manager.node().config.layout(), name)?;
    Ok(build_id_of(&t))
}

/// The build id of the template as it is now: UUID-shaped, as the SDK
/// parses it, derived from the snapshot that holds the build (so it changes
/// with every rebuild and is the same across restarts).
pub fn build_id_of(t: &Template) -> String {
    use sha2::{Digest, Sha256};
    let snapshot = t
        .snapshot
        .as_ref()
        .map_or_else(|| t.record.created_at.to_rfc3339(), |s| s.id.clone());
    let digest = Sha256::digest(format!("{}\0{snapshot}", t.record.name));
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    crate::builds::uuid_shaped(bytes)
}

#[derive(Deserialize, utoipa::ToSchema)]
pub struct AssignTags {
    /// `NAME` or `NAME:TAG`.
    target: String,
    tags: Vec<String>,
}

/// Assign tags to a template's build.
#[utoipa::path(
    post, path = "/templates/tags", tag = "templates", operation_id = "assign_tags",
    request_body = AssignTags,
    responses(
        (status = 201, description = "`{buildID, tags}`", body = Object),
        (status = 400, description = "a malformed body, name or tag", body = super::model::Error),
        (status = 404, description = "no such template", body = super::model::Error),
    ),
)]
pub async fn assign(
    State(st): State<AppState>,
    parsed: Result<Json<AssignTags>, JsonRejection>,
) -> Result<Response, ApiError> {
    let req = body(parsed)?;
    let name = template_name(&req.target)?;
    let wanted = req
        .tags
        .iter()
        .map(|t| tag_part(t))
        .collect::<Result<Vec<_>, _>>()?;
    let build_id = current_build(&st, &name)?;
    tags::assign(
        &st.manager.node().config.layout(),
        &name,
        &build_id,
        &wanted,
    )?;
    let out = json!({ "buildID": build_id, "tags": wanted });
    Ok((StatusCode::CREATED, Json(out)).into_response())
}

#[derive(Deserialize, utoipa::ToSchema)]
pub struct RemoveTags {
    name: String,
    tags: Vec<String>,
}

/// Remove tags from a template.
#[utoipa::path(
    delete, path = "/templates/tags", tag = "templates", operation_id = "remove_tags",
    request_body = RemoveTags,
    responses(
        (status = 204, description = "removed"),
        (status = 400, description = "a malformed body, name or tag", body = super::model::Error),
        (status = 404, description = "no such template", body = super::model::Error),
    ),
)]
pub async fn remove(
    State(st): State<AppState>,
    parsed: Result<Json<RemoveTags>, JsonRejection>,
) -> Result<StatusCode, ApiError> {
    let req = body(parsed)?;
    let name = template_name(&req.name)?;
    current_build(&st, &name)?;
    let wanted = req
        .tags
        .iter()
        .map(|t| tag_part(t))
        .collect::<Result<Vec<_>, _>>()?;
    tags::remove(&st.manager.node().config.layout(), &name, &wanted)?;
    Ok(StatusCode::NO_CONTENT)
}

/// A template's tags.
#[utoipa::path(
    get, path = "/templates/{id}/tags", tag = "templates", operation_id = "list_tags", params(("id" = String, Path, description = "the template's name")),
    responses(
        (status = 200, description = "`[{tag, buildID, createdAt}]`", body = [Object]),
        (status = 400, description = "not a template name", body = super::model::Error),
        (status = 404, description = "no such template", body = super::model::Error),
    ),
)]
pub async fn list(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Vec<Value>>, ApiError> {
    let name = template_name(&id)?;
    current_build(&st, &name)?;
    let all = tags::of_template(&st.manager.node().config.layout(), &name)?;
    Ok(Json(
        all.into_iter()
            .map(|(tag, t)| json!({"tag": tag, "buildID": t.build_id, "createdAt": t.created_at}))
            .collect(),
    ))
}

/// Tags a finished build with the tag of its `name:tag` and the `tags` of
/// its create request.
pub fn tag_build(st: &AppState, t: &template::Template, wanted: &[String]) -> Result<(), ApiError> {
    if wanted.is_empty() {
        return Ok(());
    }
    let tags: Vec<String> = wanted.iter().filter_map(|t| tag_part(t).ok()).collect();
    tags::assign(
        &st.manager.node().config.layout(),
        &t.record.name,
        &build_id_of(t),
        &tags,
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_need_both_parts_when_qualified() {
        assert_eq!(tag_part("prod").unwrap(), "prod");
        assert_eq!(tag_part("app:v1").unwrap(), "v1");
        assert!(tag_part(":v1").is_err());
        assert!(tag_part("app:").is_err());
        assert!(tag_part("").is_err());
    }
}
