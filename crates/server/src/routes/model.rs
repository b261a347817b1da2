//! The E2B JSON models (`shared/reference/e2b-contract.md` §2.3): the
//! types the handlers answer with, and (through `ToSchema`) the schemas of
//! the served OpenAPI document.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use siesta_sandbox::sandbox::{OnTimeout, SandboxInfo};
use utoipa::ToSchema;

/// The error body of every failed request.
#[derive(Serialize, ToSchema)]
pub struct Error {
    /// The HTTP status again.
    pub code: u16,
    /// What was wrong and what to do.
    pub message: String,
    /// E2B's machine-readable code, where the SDK acts on one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_code: Option<&'static str>,
}

/// `Sandbox`: the create, connect and fork result.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Sandbox {
    #[serde(rename = "templateID")]
    template_id: String,
    #[serde(rename = "sandboxID")]
    sandbox_id: String,
    #[serde(rename = "clientID")]
    client_id: &'static str,
    envd_version: &'static str,
    envd_access_token: String,
    traffic_access_token: Option<String>,
    /// Sandbox host names are `{port}-{sandboxID}.{domain}`.
    domain: Option<String>,
    /// siesta extension, ignored by the SDK: where this host reaches the
    /// agent directly.
    agent_address: Option<String>,
    /// siesta extension: how the last resume's stages went.
    #[schema(value_type = Option<Object>)]
    timings: Option<Value>,
}

impl Sandbox {
    pub fn new(info: &SandboxInfo, domain: Option<&str>) -> Self {
        Self {
            template_id: info.template.clone(),
            sandbox_id: info.id.clone(),
            client_id: "siesta",
            envd_version: siesta_envd_proto::ENVD_VERSION,
            envd_access_token: info.access_token.clone(),
            traffic_access_token: info.traffic_token.clone(),
            domain: domain.map(str::to_string),
            agent_address: info.agent_addr.map(|a| a.to_string()),
            timings: timings(info),
        }
    }
}

fn timings(info: &SandboxInfo) -> Option<Value> {
    info.timings
        .as_ref()
        .and_then(|t| serde_json::to_value(t).ok())
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum State {
    Running,
    Paused,
    Dead,
}

/// `ListedSandbox`: one item of `GET /v2/sandboxes`.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListedSandbox {
    #[serde(rename = "templateID")]
    template_id: String,
    #[serde(rename = "sandboxID")]
    sandbox_id: String,
    #[serde(rename = "clientID")]
    client_id: &'static str,
    started_at: DateTime<Utc>,
    end_at: DateTime<Utc>,
    cpu_count: u32,
    #[serde(rename = "memoryMB")]
    memory_mb: u32,
    #[serde(rename = "diskSizeMB")]
    disk_size_mb: u64,
    state: State,
    envd_version: &'static str,
    metadata: std::collections::HashMap<String, String>,
    /// Why a dead sandbox died.
    dead_reason: Option<String>,
}

impl ListedSandbox {
    pub fn new(info: &SandboxInfo) -> Self {
        use siesta_sandbox::sandbox::SandboxState as S;
        Self {
            template_id: info.template.clone(),
            sandbox_id: info.id.clone(),
            client_id: "siesta",
            started_at: info.started_at,
            end_at: info.end_at,
            cpu_count: info.cpu_count,
            memory_mb: info.memory_mb,
            disk_size_mb: info.disk_size_mb,
            state: match info.state {
                S::Running => State::Running,
                S::Paused => State::Paused,
                S::Dead => State::Dead,
            },
            envd_version: siesta_envd_proto::ENVD_VERSION,
            metadata: info.metadata.clone(),
            dead_reason: info.dead_reason.clone(),
        }
    }
}

/// The egress rules as E2B reports them.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkRules {
    /// Addresses, CIDRs and domain patterns it may reach.
    allow_out: Vec<String>,
    /// Addresses and CIDRs it may not reach.
    deny_out: Vec<String>,
}

#[derive(Serialize, ToSchema)]
pub struct VolumeMount {
    name: String,
    path: String,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum TimeoutAction {
    Pause,
    Kill,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LifecycleModel {
    /// Whether traffic to it while paused resumes it.
    auto_resume: bool,
    on_timeout: TimeoutAction,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum PauseMode {
    /// Memory and disk: a resume continues where it stopped.
    Full,
    /// The disk only: a resume cold-boots.
    Filesystem,
}

/// `SandboxDetail`: `GET /sandboxes/{id}`.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxDetail {
    #[serde(flatten)]
    listed: ListedSandbox,
    envd_access_token: String,
    traffic_access_token: Option<String>,
    allow_internet_access: bool,
    network: NetworkRules,
    domain: Option<String>,
    volume_mounts: Vec<VolumeMount>,
    lifecycle: LifecycleModel,
    pause_mode: PauseMode,
    /// siesta extension: where this host reaches the agent directly.
    agent_address: Option<String>,
    /// siesta extension: how the last resume's stages went.
    #[schema(value_type = Option<Object>)]
    timings: Option<Value>,
}

impl SandboxDetail {
    pub fn new(info: &SandboxInfo, domain: Option<&str>) -> Self {
        let egress = &info.egress;
        let allow_out = (egress.allow_out.iter().map(ToString::to_string))
            .chain(egress.allow_domains.iter().map(ToString::to_string));
        Self {
            listed: ListedSandbox::new(info),
            envd_access_token: info.access_token.clone(),
            traffic_access_token: info.traffic_token.clone(),
            allow_internet_access: egress.allow_internet,
            network: NetworkRules {
                allow_out: allow_out.collect(),
                deny_out: egress.deny_out.iter().map(ToString::to_string).collect(),
            },
            domain: domain.map(str::to_string),
            volume_mounts: (info.volume_mounts.iter())
                .map(|m| VolumeMount {
                    name: m.name.clone(),
                    path: m.path.clone(),
                })
                .collect(),
            lifecycle: LifecycleModel {
                auto_resume: info.lifecycle.auto_resume,
                on_timeout: match info.lifecycle.on_timeout {
                    OnTimeout::Pause => TimeoutAction::Pause,
                    OnTimeout::Kill => TimeoutAction::Kill,
                },
            },
            pause_mode: if info.lifecycle.filesystem_only {
                PauseMode::Filesystem
            } else {
                PauseMode::Full
            },
            agent_address: info.agent_addr.map(|a| a.to_string()),
            timings: timings(info),
        }
    }
}
