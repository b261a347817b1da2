//! The E2B JSON models (`shared/reference/e2b-contract.md` §2.3).

use serde_json::{json, Value};
use siesta_sandbox::sandbox::{OnTimeout, SandboxInfo};

/// `Sandbox`: the create, connect and fork result.
pub fn sandbox(info: &SandboxInfo, domain: Option<&str>) -> Value {
    json!({
        "templateID": info.template,
        "sandboxID": info.id,
        "clientID": "siesta",
        "envdVersion": siesta_envd_proto::ENVD_VERSION,
        "envdAccessToken": info.access_token,
        "trafficAccessToken": info.traffic_token,
        "domain": domain,
        // siesta extensions, ignored by the SDK: where this host reaches the
        // agent directly, and how the last resume's stages went.
        "agentAddress": info.agent_addr.map(|a| a.to_string()),
        "timings": info.timings,
    })
}

/// `ListedSandbox`: one item of `GET /v2/sandboxes`.
pub fn listed(info: &SandboxInfo) -> Value {
    json!({
        "templateID": info.template,
        "sandboxID": info.id,
        "clientID": "siesta",
        "startedAt": info.started_at,
        "endAt": info.end_at,
        "cpuCount": info.cpu_count,
        "memoryMB": info.memory_mb,
        "diskSizeMB": info.disk_size_mb,
        "state": info.state.as_str(),
        "envdVersion": siesta_envd_proto::ENVD_VERSION,
        "metadata": info.metadata,
        "deadReason": info.dead_reason,
    })
}

/// `SandboxDetail`: `GET /sandboxes/{id}`.
pub fn detail(info: &SandboxInfo, domain: Option<&str>) -> Value {
    let mut v = listed(info);
    let extra = json!({
        "envdAccessToken": info.access_token,
        "trafficAccessToken": info.traffic_token,
        "allowInternetAccess": info.egress.allow_internet,
        "network": {
            "allowOut": info.egress.allow_out.iter().map(ToString::to_string)
                .chain(info.egress.allow_domains.iter().map(ToString::to_string))
                .collect::<Vec<_>>(),
            "denyOut": info.egress.deny_out,
        },
        "domain": domain,
        "volumeMounts": info.volume_mounts.iter()
            .map(|m| json!({"name": m.name, "path": m.path}))
            .collect::<Vec<_>>(),
        "lifecycle": {
            "autoResume": info.lifecycle.auto_resume,
            "onTimeout": match info.lifecycle.on_timeout {
                OnTimeout::Pause => "pause",
                OnTimeout::Kill => "kill",
            },
        },
        "pauseMode": if info.lifecycle.filesystem_only { "filesystem" } else { "full" },
        "agentAddress": info.agent_addr.map(|a| a.to_string()),
        "timings": info.timings,
    });
    if let (Some(a), Some(b)) = (v.as_object_mut(), extra.as_object()) {
        a.extend(b.clone());
    }
    v
}
