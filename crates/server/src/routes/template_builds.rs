//! The E2B template build API, as the SDKs' `Template.build` calls it
//! (`shared/reference/e2b-template-build.md`): create a template and a
//! build, start the build with its steps, its status and logs; aliases,
//! get and delete. COPY files arrive through [`super::template_files`].
//!
//! A template's id is its name. Builds start from an existing template
//! (`fromTemplate`); `fromImage: "e2bdev/base"`, the SDK's default, means
//! this node's `base` template. Other images are refused until OCI image
//! sources land.

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use siesta_sandbox::Error;
use siesta_template::{self as template, BuildSource, Step, StepsBuild};
use utoipa::ToSchema;

use super::{body, AppState};
use crate::builds::{BuildStatus, FailureReason, MAX_LOG_PAGE};
use crate::error::ApiError;

/// The image the SDK builds from when none is named (`Template()`,
/// `from_base_image()`): this node's default template stands in for it.
const E2B_BASE_IMAGE: &str = "e2bdev/base";
const DEFAULT_TEMPLATE: &str = "base";

/// E2B's `TemplateBuildRequestV3`.
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NewTemplate {
    name: Option<String>,
    alias: Option<String>,
    #[serde(default)]
    tags: Vec<String>,
    cpu_count: Option<u32>,
    #[serde(rename = "memoryMB")]
    memory_mb: Option<u32>,
    min_free_disk_mb: Option<u32>,
}

/// `name` or `name:tag` → the template name (tags are not kept apart yet).
pub(super) fn template_name(raw: &str) -> Result<String, ApiError> {
    let name = raw.split(':').next().unwrap_or("");
    siesta_sandbox::layout::validate_name("template", name)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e))?;
    Ok(name.to_string())
}

/// A new build of template `name` (created if new).
#[utoipa::path(
    post, path = "/v3/templates", tag = "templates",
    request_body = NewTemplate,
    responses(
        (status = 202, description = "`{templateID, buildID, names, aliases, tags, public}`", body = Object),
        (status = 400, description = "a malformed body or name", body = super::model::Error),
        (status = 409, description = "a build of it runs already", body = super::model::Error),
    ),
)]
pub async fn create(
    State(st): State<AppState>,
    parsed: Result<Json<NewTemplate>, JsonRejection>,
) -> Result<Response, ApiError> {
    let req = body(parsed)?;
    let raw = req
        .name
        .or(req.alias)
        .ok_or_else(|| ApiError::new(StatusCode::BAD_REQUEST, "the template needs a name"))?;
    let name = template_name(&raw)?;
    if st.builds.is_building(&name, "") {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("template {name:?} is being built already; wait for that build to end"),
        ));
    }
    // `name:tag` and `tags` tag the build once it is ready.
    let mut tags = req.tags.clone();
    if let Some((_, tag)) = raw.split_once(':') {
        tags.push(tag.to_string());
    }
    let build_id = st.builds.create(
        &name,
        req.cpu_count,
        req.memory_mb,
        req.min_free_disk_mb,
        tags.clone(),
    );
    if tags.is_empty() {
        tags.push("default".to_string());
    }
    let out = json!({
        "templateID": name, "buildID": build_id, "public": false,
        "names": [name], "aliases": [name], "tags": tags,
    });
    Ok((StatusCode::ACCEPTED, Json(out)).into_response())
}

/// E2B's `TemplateBuildStartV2`.
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct StartBuild {
    from_image: Option<String>,
    from_image_registry: Option<ImageRegistry>,
    from_template: Option<String>,
    #[serde(default)]
    force: bool,
    #[serde(default)]
    steps: Vec<StepBody>,
    start_cmd: Option<String>,
    ready_cmd: Option<String>,
}

/// `fromImageRegistry`: how to log in to the image's registry.
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImageRegistry {
    /// `registry` (user name and password); other kinds are refused.
    #[serde(rename = "type")]
    kind: String,
    username: Option<String>,
    password: Option<String>,
}

/// One step: `RUN`, `COPY`, `ENV`, `WORKDIR` or `USER`, with its
/// arguments.
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct StepBody {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    args: Vec<String>,
    files_hash: Option<String>,
    #[serde(default)]
    force: bool,
}

/// Start a build created by `POST /v3/templates`.
#[utoipa::path(
    post, path = "/v2/templates/{id}/builds/{buildID}", tag = "templates",
    params(("id" = String, Path, description = "the template's name"), ("buildID" = String, Path, description = "the build's id")),
    request_body = StartBuild,
    responses(
        (status = 202, description = "started"),
        (status = 400, description = "a malformed body, step or image", body = super::model::Error),
        (status = 404, description = "no such build, or a missing source template", body = super::model::Error),
        (status = 409, description = "started already", body = super::model::Error),
    ),
)]
pub async fn start(
    State(st): State<AppState>,
    Path((template_id, build_id)): Path<(String, String)>,
    parsed: Result<Json<StartBuild>, JsonRejection>,
) -> Result<StatusCode, ApiError> {
    let req = body(parsed)?;
    let build = find_build(&st, &template_id, &build_id)?;
    if build.status != BuildStatus::Waiting {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("build {build_id} was started already"),
        ));
    }
    if st.builds.is_building(&template_id, &build_id) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("template {template_id:?} is being built already"),
        ));
    }
    let source = source_of(&req, st.manager.node().config.api_image_reach())?;
    refuse_closed_registry(&source).await?;
    let steps = req
        .steps
        .iter()
        .enumerate()
        .map(|(i, s)| step_of(&st, i + 1, s))
        .collect::<Result<Vec<_>, _>>()?;
    let rebuild_from = rebuild_from(&req);
    let plan = StepsBuild {
        name: template_id,
        source,
        steps,
        start_cmd: req.start_cmd.filter(|c| !c.trim().is_empty()),
        ready_cmd: req.ready_cmd.filter(|c| !c.trim().is_empty()),
        vcpus: build.vcpus,
        memory_mib: build.memory_mib,
        disk_mib: None,
        min_free_disk_mib: build.min_free_disk_mib,
        rebuild_from,
    };
    st.builds.set_status(&build_id, BuildStatus::Building, None);
    tokio::spawn(run(st, build_id, plan));
    Ok(StatusCode::ACCEPTED)
}

/// E2B's `force`: the whole build (the base too), or from the first step
/// that has it on.
fn rebuild_from(req: &StartBuild) -> Option<usize> {
    if req.force {
        return Some(0);
    }
    req.steps.iter().position(|s| s.force).map(|i| i + 1)
}

/// What the build starts from; an image's pull gets `reach` (the node's
/// [`siesta_sandbox::NodeConfig::api_image_reach`]: public addresses and
/// the networks the operator opened).
fn source_of(req: &StartBuild, reach: siesta_image::Reach) -> Result<BuildSource, ApiError> {
    match (&req.from_template, &req.from_image) {
        (Some(t), _) => Ok(BuildSource::Template(template_name(t)?)),
        (None, Some(image)) if is_e2b_base(image) => {
            Ok(BuildSource::Template(DEFAULT_TEMPLATE.into()))
        }
        (None, Some(image)) => Ok(BuildSource::Image {
            reference: image_reference(image)?,
            credentials: credentials_of(req.from_image_registry.as_ref())?,
            reach,
        }),
        (None, None) => Ok(BuildSource::Template(DEFAULT_TEMPLATE.into())),
    }
}

/// A 400 for an image whose registry is at an address the build's pull
/// may not reach (loopback, private, link-local, ...: M7 of the security
/// review), naming the host, its address and the setting that opens it.
/// The registry's name is resolved here and every address checked, so
/// the client hears it at once; the pull checks again as it connects
/// (its token service and redirects too), so a name that resolves
/// otherwise by then is refused in the build's log.
async fn refuse_closed_registry(source: &BuildSource) -> Result<(), ApiError> {
    let BuildSource::Image {
        reference, reach, ..
    } = source
    else {
        return Ok(());
    };
    let bad = |e: siesta_image::ImageError| {
        ApiError::new(StatusCode::BAD_REQUEST, format!("fromImage: {e}"))
    };
    siesta_image::ImageSource::parse(reference)
        .map_err(bad)?
        .check_reach(reach)
        .await
        .map_err(bad)
}

/// A registry reference (local `oci:`/`docker-archive:` paths are the CLI's:
/// an API client must not make the server read its files).
fn image_reference(image: &str) -> Result<String, ApiError> {
    let bad = |m: String| ApiError::new(StatusCode::BAD_REQUEST, m);
    match siesta_image::ImageSource::parse(image) {
        Ok(siesta_image::ImageSource::Registry(_)) => Ok(image.to_string()),
        Ok(_) => Err(bad(format!(
            "fromImage {image:?}: only registry images can be built through the API; \
             build local layouts and archives with `siesta template build NAME --image {image}`"
        ))),
        Err(e) => Err(bad(format!("fromImage: {e}"))),
    }
}

fn credentials_of(
    registry: Option<&ImageRegistry>,
) -> Result<Option<siesta_image::Credentials>, ApiError> {
    let Some(r) = registry else { return Ok(None) };
    match r.kind.as_str() {
        "registry" => match (&r.username, &r.password) {
            (Some(u), Some(p)) => Ok(Some(siesta_image::Credentials {
                username: u.clone(),
                password: p.clone(),
            })),
            _ => Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "fromImageRegistry of type registry needs username and password",
            )),
        },
        other => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!(
                "fromImageRegistry type {other:?} is not supported (only \"registry\", with username and password)"
            ),
        )),
    }
}

fn is_e2b_base(image: &str) -> bool {
    let repo = image.split([':', '@']).next().unwrap_or("");
    matches!(
        repo,
        "e2bdev/base" | "docker.io/e2bdev/base" | "index.docker.io/e2bdev/base"
    ) || repo == E2B_BASE_IMAGE
}

fn step_of(st: &AppState, n: usize, s: &StepBody) -> Result<Step, ApiError> {
    let bad = |m: String| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("step {n} ({}): {m}", s.kind),
        )
    };
    let arg = |i: usize| s.args.get(i).cloned().filter(|a| !a.is_empty());
    match s.kind.to_ascii_uppercase().as_str() {
        "RUN" => Ok(Step::Run {
            command: arg(0).ok_or_else(|| bad("no command".into()))?,
            user: arg(1),
        }),
        "ENV" => {
            if !s.args.len().is_multiple_of(2) {
                return Err(bad("ENV takes name, value pairs".into()));
            }
            Ok(Step::Env(
                s.args
                    .chunks(2)
                    .map(|kv| (kv[0].clone(), kv[1].clone()))
                    .collect(),
            ))
        }
        "WORKDIR" => Ok(Step::Workdir(
            arg(0).ok_or_else(|| bad("no directory".into()))?,
        )),
        "USER" => Ok(Step::User(arg(0).ok_or_else(|| bad("no user".into()))?)),
        "COPY" | "ADD" => copy_step(st, s).map_err(bad),
        other => Err(bad(format!(
            "unknown step type {other:?} (this node runs RUN, COPY, ENV, WORKDIR and USER)"
        ))),
    }
}

fn copy_step(st: &AppState, s: &StepBody) -> Result<Step, String> {
    let hash = s
        .files_hash
        .as_deref()
        .ok_or("a COPY step needs its filesHash")?;
    let archive = st
        .builds
        .archive_path(hash)
        .ok_or("filesHash must be 64 hex digits")?;
    if !archive.exists() {
        return Err(format!("the files for hash {hash} were not uploaded (GET /templates/{{id}}/files/{hash} gives a link)"));
    }
    let source = s
        .args
        .first()
        .cloned()
        .filter(|d| !d.is_empty())
        .ok_or("no source")?;
    let dest = s
        .args
        .get(1)
        .cloned()
        .filter(|d| !d.is_empty())
        .ok_or("no destination")?;
    let owner = s.args.get(2).cloned().filter(|o| !o.is_empty());
    let mode = match s.args.get(3).map(String::as_str).filter(|m| !m.is_empty()) {
        Some(m) => Some(u32::from_str_radix(m, 8).map_err(|_| format!("mode {m:?} is not octal"))?),
        None => None,
    };
    Ok(Step::Copy {
        archive,
        sources: vec![source],
        digest: hash.to_string(),
        dest,
        owner,
        mode,
    })
}

/// Runs the build in the background and records how it ended.
async fn run(st: AppState, build_id: String, plan: StepsBuild) {
    let builds = st.builds.clone();
    let id = build_id.clone();
    let log: template::BuildLog = std::sync::Arc::new(move |level, phase, msg| {
        let level = match level {
            template::LogLevel::Info => "info",
            template::LogLevel::Warn => "warn",
            template::LogLevel::Error => "error",
            // Bars are for terminals; the pull's lines are in the log.
            template::LogLevel::Progress => return,
        };
        builds.log(&id, level, Some(phase.to_string()), msg);
    });
    match template::build_from_steps(st.manager.node(), &plan, &log).await {
        Ok(t) => {
            record_manifest(&st, &build_id, &t).await;
            let wanted = st.builds.get(&build_id).map(|b| b.tags).unwrap_or_default();
            if let Err(e) = super::template_tags::tag_build(&st, &t, &wanted) {
                st.builds
                    .log(&build_id, "warn", None, &format!("tagging: {}", e.message));
            }
            st.builds.log(
                &build_id,
                "info",
                None,
                &format!("template {} is ready", t.record.name),
            );
            st.builds.set_status(&build_id, BuildStatus::Ready, None);
        }
        Err(e) => {
            let step = match &e {
                siesta_template::Error::BuildFailed { phase, .. } => Some(phase.to_string()),
                _ => None,
            };
            let message = e.to_string();
            tracing::warn!(template = %plan.name, build = %build_id, "template build failed: {message}");
            st.builds.log(&build_id, "error", step.clone(), &message);
            st.builds.set_status(
                &build_id,
                BuildStatus::Error,
                Some(FailureReason { message, step }),
            );
        }
    }
}

/// Records the new template's startup manifest (what its resumes
/// prefetch); a template without one still works, only slower to resume.
async fn record_manifest(st: &AppState, build_id: &str, t: &template::Template) {
    let node = st.manager.node();
    if !node.config.record_manifest || t.snapshot.as_ref().is_some_and(|s| s.manifest.is_some()) {
        return;
    }
    let line = match template::record_startup_manifest(node, t).await {
        Ok(m) => format!(
            "startup manifest: {:.1} MiB in {} ranges",
            m.bytes as f64 / 1048576.0,
            m.ranges
        ),
        Err(e) => format!("startup manifest not recorded (resumes will not prefetch): {e}"),
    };
    st.builds
        .log(build_id, "info", Some("finalize".into()), &line);
}

/// Build `build` of template `template`, or a 404 saying builds last until
/// the server restarts.
fn find_build(
    st: &AppState,
    template: &str,
    build: &str,
) -> Result<crate::builds::Build, ApiError> {
    st.builds
        .get(build)
        .filter(|b| b.template == template)
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                format!("build {build:?} of template {template:?} not found (builds are kept until the server restarts)"),
            )
        })
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(rename_all = "camelCase")]
pub struct StatusQuery {
    #[serde(default)]
    logs_offset: usize,
    #[param(maximum = 100)]
    limit: Option<usize>,
}

/// A build's status and a page of its log.
#[utoipa::path(
    get, path = "/templates/{id}/builds/{buildID}/status", tag = "templates",
    params(("id" = String, Path, description = "the template's name"), ("buildID" = String, Path, description = "the build's id"), StatusQuery),
    responses(
        (status = 200, description = "`{templateID, buildID, status, logs, logEntries, reason?}`", body = Object),
        (status = 400, description = "a malformed query", body = super::model::Error),
        (status = 404, description = "no such build", body = super::model::Error),
    ),
)]
pub async fn status(
    State(st): State<AppState>,
    Path((template_id, build_id)): Path<(String, String)>,
    Query(q): Query<StatusQuery>,
) -> Result<Json<Value>, ApiError> {
    let build = find_build(&st, &template_id, &build_id)?;
    let limit = q.limit.unwrap_or(MAX_LOG_PAGE).min(MAX_LOG_PAGE);
    let page: Vec<_> = build
        .entries
        .iter()
        .skip(q.logs_offset)
        .take(limit)
        .collect();
    let mut out = json!({
        "templateID": template_id, "buildID": build_id,
        "status": build.status, "logs": [], "logEntries": page,
    });
    if let Some(reason) = &build.reason {
        out["reason"] = json!(reason);
    }
    Ok(Json(out))
}

/// A build's whole log.
#[utoipa::path(
    get, path = "/templates/{id}/builds/{buildID}/logs", tag = "templates",
    params(("id" = String, Path, description = "the template's name"), ("buildID" = String, Path, description = "the build's id")),
    responses(
        (status = 200, description = "`{logs}`", body = Object),
        (status = 404, description = "no such build", body = super::model::Error),
    ),
)]
pub async fn logs(
    State(st): State<AppState>,
    Path((template_id, build_id)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let build = find_build(&st, &template_id, &build_id)?;
    Ok(Json(json!({ "logs": build.entries })))
}

/// Whether a template of that name exists.
#[utoipa::path(
    get, path = "/templates/aliases/{alias}", tag = "templates",
    params(("alias" = String, Path)),
    responses(
        (status = 200, description = "`{templateID, public}`", body = Object),
        (status = 400, description = "not a template name", body = super::model::Error),
        (status = 404, description = "no such template", body = super::model::Error),
    ),
)]
pub async fn alias(
    State(st): State<AppState>,
    Path(alias): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let layout = st.manager.node().config.layout();
    let name = template_name(&alias)?;
    match template::Template::open(&layout, &name) {
        Ok(_) => Ok(Json(json!({ "templateID": name, "public": false }))),
        Err(siesta_template::Error::TemplateNotFound { .. }) => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("template alias {alias:?} not found"),
        )),
        Err(e) => Err(e.into()),
    }
}

/// One template (its id is its name) with the builds this server ran of it.
#[utoipa::path(
    get, path = "/templates/{id}", tag = "templates", params(("id" = String, Path, description = "the template's name")),
    responses(
        (status = 200, description = "E2B's `TemplateWithBuilds`", body = Object),
        (status = 400, description = "not a template name", body = super::model::Error),
        (status = 404, description = "no such template", body = super::model::Error),
    ),
)]
pub async fn get(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let layout = st.manager.node().config.layout();
    let name = template_name(&id)?;
    let t = template::Template::open(&layout, &name)?;
    let mut out = super::templates::describe(&t);
    let builds: Vec<Value> = st
        .builds
        .of_template(&name)
        .into_iter()
        .map(|(id, b)| json!({"buildID": id, "status": b.status, "createdAt": b.created_at, "updatedAt": b.created_at}))
        .collect();
    out["builds"] = builds.into();
    Ok(Json(out))
}

/// Delete a user snapshot of that id or name (E2B's snapshots are
/// templates; from the object store too, when one is configured), else
/// the template.
#[utoipa::path(
    delete, path = "/templates/{id}", tag = "templates",
    params(("id" = String, Path, description = "a snapshot's id or name, or a template's name")),
    responses(
        (status = 204, description = "deleted"),
        (status = 404, description = "no such snapshot or template", body = super::model::Error),
    ),
)]
pub async fn delete(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let manager = st.manager.clone();
    let key = id.clone();
    // `Some(snapshot id)` for a snapshot, `Some(None)` for a template.
    let deleted = tokio::task::spawn_blocking(move || -> Result<Option<Option<String>>, Error> {
        if let Some(snapshot) = manager.delete_snapshot(&key)? {
            return Ok(Some(Some(snapshot)));
        }
        let template = match template_name(&key) {
            Ok(name) => template::delete(&manager.node().config.layout(), &name)?,
            Err(_) => false,
        };
        Ok(template.then_some(None))
    })
    .await
    .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))??;
    if let Some(Some(snapshot)) = &deleted {
        st.manager.unshare_snapshot(snapshot).await;
    }
    if deleted.is_some() {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("template or snapshot {id:?} not found"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    fn start_body(image: &str) -> StartBuild {
        serde_json::from_value(json!({ "fromImage": image })).unwrap()
    }

    /// The attack of M7: `fromImage` naming the node's own loopback (its
    /// etcd, a local registry), by address or by name. The build is
    /// refused with a 400 before anything connects there; opened by the
    /// operator, the same request passes.
    #[tokio::test]
    async fn an_image_on_loopback_is_refused_unless_the_operator_opens_it() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let seen = accepted.clone();
        std::thread::spawn(move || {
            for _ in listener.incoming().flatten() {
                seen.fetch_add(1, Ordering::SeqCst);
            }
        });
        let closed = siesta_sandbox::NodeConfig::new("/nonexistent").api_image_reach();
        for (image, address) in [
            (
                format!("127.0.0.1:{port}/v3/kv:x"),
                "`127.0.0.1` is a loopback address",
            ),
            (
                format!("localhost:{port}/team/app:1"),
                "`localhost` resolves to 127.0.0.1, a loopback address",
            ),
        ] {
            let source = source_of(&start_body(&image), closed.clone()).unwrap();
            let e = refuse_closed_registry(&source).await.unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST);
            for part in [
                image.as_str(),
                address,
                "image_registry_private_allow = [\"127.0.0.1/32\"]",
                "SIESTA_IMAGE_REGISTRY_PRIVATE_ALLOW=127.0.0.1/32",
            ] {
                assert!(e.message.contains(part), "{part:?} not in {}", e.message);
            }
        }
        let opened = siesta_image::Reach::public(vec!["127.0.0.1/32".parse().unwrap()]).unwrap();
        let source = source_of(&start_body(&format!("127.0.0.1:{port}/a:b")), opened).unwrap();
        assert!(refuse_closed_registry(&source).await.is_ok());
        assert_eq!(accepted.load(Ordering::SeqCst), 0, "the check connected");
    }

    #[tokio::test]
    async fn templates_and_the_e2b_base_image_need_no_registry() {
        let closed = siesta_image::Reach::public(vec![]).unwrap();
        for body in [
            json!({"fromTemplate": "base"}),
            json!({"fromImage": "e2bdev/base"}),
        ] {
            let req: StartBuild = serde_json::from_value(body).unwrap();
            let source = source_of(&req, closed.clone()).unwrap();
            assert!(matches!(source, BuildSource::Template(_)));
            assert!(refuse_closed_registry(&source).await.is_ok());
        }
    }
}
