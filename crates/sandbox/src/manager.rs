//! The sandbox manager: create, list, exec, pause, resume and kill.

use std::collections::HashMap;
use std::sync::Arc;

use siesta_net::EgressPolicy;
use siesta_vmm::MemorySave;
use tokio::sync::Mutex;

use crate::envd::{EnvdClient, ExecOutput, InitParams};
use crate::error::{Error, IoContext, Result};
use crate::node::Node;
use crate::pool::VmmPool;
use crate::resume::{self, ResumeParams, Resumed};
use crate::sandbox::{Running, Sandbox, SandboxInfo, SandboxRecord, SandboxState};
use crate::template::Template;

/// What `create` needs.
#[derive(Debug, Clone, Default)]
pub struct CreateRequest {
    pub template: String,
    pub env_vars: HashMap<String, String>,
    pub metadata: HashMap<String, String>,
    pub allow_internet: bool,
}

pub struct SandboxManager {
    node: Arc<Node>,
    pool: Arc<VmmPool>,
    sandboxes: Mutex<HashMap<String, Arc<Mutex<Sandbox>>>>,
}

impl SandboxManager {
    pub fn new(node: Arc<Node>) -> Arc<Self> {
        let pool = VmmPool::new(Arc::clone(&node));
        Arc::new(Self {
            node,
            pool,
            sandboxes: Mutex::new(HashMap::new()),
        })
    }

    pub fn node(&self) -> &Arc<Node> {
        &self.node
    }

    /// Pre-spawns pooled VMMs for `template` so the first create is a hit.
    pub fn warm(&self, template: &str) -> Result<()> {
        let t = Template::open(&self.node.config.layout(), template)?;
        self.pool.refill(t);
        Ok(())
    }

    /// Waits until a pre-spawned VMM for `template` is ready.
    pub async fn wait_pool_ready(
        &self,
        template: &str,
        timeout: std::time::Duration,
    ) -> Result<()> {
        self.pool.wait_ready(template, timeout).await
    }

    /// Resumes a new sandbox from a template.
    pub async fn create(&self, req: CreateRequest) -> Result<SandboxInfo> {
        let template = Template::open(&self.node.config.layout(), &req.template)?;
        let mut record = SandboxRecord {
            id: String::new(), // the pooled VMM brings the id
            template: req.template.clone(),
            state: SandboxState::Running,
            created_at: chrono::Utc::now(),
            access_token: crate::ids::new_token(),
            env_vars: req.env_vars,
            metadata: req.metadata,
            allow_internet: req.allow_internet,
        };
        let params = resume_params(&record);
        let resumed = resume::from_template(&self.node, &self.pool, &template, &params).await?;
        record.id = resumed.id.clone();
        let dir = resumed.dir.clone();
        let mut sandbox = Sandbox {
            dir: dir.clone(),
            record,
            running: Some(running(resumed)),
        };
        if let Err(e) = sandbox.record.store(&dir) {
            stop_running(&self.node, &mut sandbox).await;
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
        let info = sandbox.info();
        self.sandboxes
            .lock()
            .await
            .insert(info.id.clone(), Arc::new(Mutex::new(sandbox)));
        Ok(info)
    }

    pub async fn list(&self) -> Vec<SandboxInfo> {
        let all: Vec<_> = self.sandboxes.lock().await.values().cloned().collect();
        let mut out = Vec::with_capacity(all.len());
        for s in all {
            out.push(s.lock().await.info());
        }
        out.sort_by_key(|s| s.created_at);
        out
    }

    async fn get_entry(&self, id: &str) -> Result<Arc<Mutex<Sandbox>>> {
        self.sandboxes
            .lock()
            .await
            .get(id)
            .cloned()
            .ok_or_else(|| Error::SandboxNotFound { id: id.to_string() })
    }

    pub async fn get(&self, id: &str) -> Result<SandboxInfo> {
        Ok(self.get_entry(id).await?.lock().await.info())
    }

    /// A client for the agent of running sandbox `id`.
    pub async fn envd(&self, id: &str) -> Result<EnvdClient> {
        let entry = self.get_entry(id).await?;
        let sb = entry.lock().await;
        let running = sb
            .running
            .as_ref()
            .ok_or_else(|| wrong_state(&sb, "running"))?;
        Ok(EnvdClient::new(
            id,
            running.agent_addr,
            Some(sb.record.access_token.clone()),
        ))
    }

    /// Runs `cmd` in sandbox `id` as `user` and waits for it.
    pub async fn exec(
        &self,
        id: &str,
        cmd: &str,
        user: Option<&str>,
        on_output: impl FnMut(bool, &[u8]),
    ) -> Result<ExecOutput> {
        self.envd(id).await?.exec(cmd, user, on_output).await
    }

    /// Saves the sandbox's memory, devices and disk, then stops its VM and
    /// frees its slot. Its files and processes come back on `resume`.
    pub async fn pause(&self, id: &str) -> Result<()> {
        let entry = self.get_entry(id).await?;
        let mut sb = entry.lock().await;
        let state_path = sb.state_path();
        let running = sb.running.as_mut().ok_or_else(|| Error::WrongState {
            id: id.to_string(),
            state: "paused".into(),
            expected: "running",
        })?;
        let vmm_err = |source| Error::vmm(id.to_string(), source);
        running.vm.pause().await.map_err(vmm_err)?;
        let tmp = state_path.with_extension("bin.tmp");
        if let Err(e) = running.vm.save(&tmp, MemorySave::InState).await {
            // Nothing is lost: the VM is still there; let it go on.
            let _ = running.vm.resume().await;
            let _ = std::fs::remove_file(&tmp);
            return Err(vmm_err(e));
        }
        std::fs::rename(&tmp, &state_path).ctx("publishing paused state", &state_path)?;
        sb.record.state = SandboxState::Paused;
        sb.record.store(&sb.dir.clone())?;
        stop_running(&self.node, &mut sb).await;
        Ok(())
    }

    /// Brings a paused sandbox back with its files and processes.
    pub async fn resume(&self, id: &str) -> Result<SandboxInfo> {
        let entry = self.get_entry(id).await?;
        let mut sb = entry.lock().await;
        if sb.running.is_some() {
            return Err(wrong_state(&sb, "paused"));
        }
        let template = Template::open(&self.node.config.layout(), &sb.record.template)?;
        let params = resume_params(&sb.record);
        let resumed =
            resume::from_paused(&self.node, &template, id, &sb.dir.clone(), &params).await?;
        sb.running = Some(running(resumed));
        sb.record.state = SandboxState::Running;
        sb.record.store(&sb.dir.clone())?;
        Ok(sb.info())
    }

    /// Stops the sandbox and deletes everything it had.
    pub async fn kill(&self, id: &str) -> Result<()> {
        let entry = self
            .sandboxes
            .lock()
            .await
            .remove(id)
            .ok_or_else(|| Error::SandboxNotFound { id: id.to_string() })?;
        let mut sb = entry.lock().await;
        stop_running(&self.node, &mut sb).await;
        std::fs::remove_dir_all(&sb.dir).ctx("removing sandbox directory", &sb.dir)?;
        Ok(())
    }

    /// Kills every sandbox and stops the pooled VMMs (server shutdown, tests).
    pub async fn shutdown(&self) {
        let ids: Vec<String> = self.sandboxes.lock().await.keys().cloned().collect();
        for id in ids {
            if let Err(e) = self.kill(&id).await {
                tracing::warn!(sandbox = %id, "kill at shutdown: {e}");
            }
        }
        self.pool.drain().await;
    }
}

fn running(r: Resumed) -> Running {
    let agent_addr = Node::agent_addr(&r.slot);
    Running {
        vm: r.vm,
        slot: r.slot,
        run_dir: r.run_dir,
        agent_addr,
        timings: r.timings,
    }
}

async fn stop_running(node: &Node, sb: &mut Sandbox) {
    if let Some(mut r) = sb.running.take() {
        if let Err(e) = r.vm.shutdown().await {
            tracing::warn!(sandbox = %sb.record.id, "stopping VMM: {e}");
        }
        node.release_slot(r.slot).await;
        let _ = std::fs::remove_dir_all(&r.run_dir);
    }
}

fn resume_params(record: &SandboxRecord) -> ResumeParams {
    ResumeParams {
        init: InitParams::new(Some(record.access_token.clone()), record.env_vars.clone()),
        egress: EgressPolicy {
            allow_internet: record.allow_internet,
        },
    }
}

fn wrong_state(sb: &Sandbox, expected: &'static str) -> Error {
    Error::WrongState {
        id: sb.record.id.clone(),
        state: sb.record.state.to_string(),
        expected,
    }
}
