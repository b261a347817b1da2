//! Builds a template from steps: boot a VM on the base disk (a copy of the
//! source template's, or one written from an OCI image by `from_image.rs`),
//! run the steps in it through the agent, start the start command and wait
//! for its ready check, then freeze the VM as the new template. Its
//! sandboxes resume with the start command's process running.
//!
//! Phases, as build errors name them (E2B's `reason.step`): `base` (the
//! source and the boot), `1`, `2`, ... (the steps), `finalize` (start and
//! ready commands, freezing, publishing).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::base::Base;
use crate::build::{
    boot_spec, boot_until_healthy, claim_build_agent, freeze, init_before_freeze, VmSize,
};
use crate::error::{Error, Result};
use crate::layered::LayeredDisk;
use crate::publish::publish_off_thread;
use crate::record::{
    self, file_records, guest_assets_digest_off_thread, SourceImage, TemplateDefaults,
    TemplateRecord,
};
use crate::steps::{Step, StepContext, StepsBuild};
use crate::Template;
use siesta_envd_client::GuestDefaults;
use siesta_envd_client::{EnvdClient, ExecOptions};
use siesta_host::layout::validate_name;
use siesta_host::Host;

/// How long the ready check may take before the build fails.
const READY_TIMEOUT: Duration = Duration::from_secs(300);

/// Severity of a build log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel {
    Info,
    Warn,
    Error,
    /// A progress bar's new state (a layer's bytes): for a terminal, not a
    /// build log; the server does not record these.
    Progress,
}

/// Where a build is, for its log lines and its failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BuildPhase {
    Base,
    /// Step `n`, counted from 1 in the user's order.
    Step(usize),
    Finalize,
}

impl std::fmt::Display for BuildPhase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BuildPhase::Base => f.write_str("base"),
            BuildPhase::Step(n) => write!(f, "{n}"),
            BuildPhase::Finalize => f.write_str("finalize"),
        }
    }
}

/// Receives the build's log lines as they happen.
pub type BuildLog = Arc<dyn Fn(LogLevel, &BuildPhase, &str) + Send + Sync>;

/// Builds `build` and returns the template; an identical earlier build of
/// the same name is returned as it is, and a build that shares its first
/// steps with an earlier one starts after them (unless `build.rebuild_from`
/// says otherwise).
pub async fn build_from_steps(node: &Host, build: &StepsBuild, log: &BuildLog) -> Result<Template> {
    validate_name("template", &build.name).map_err(Error::Invalid)?;
    let layout = node.config.layout();
    let base = Base::resolve(node, &build.source, log)
        .await
        .map_err(|e| failed(build, BuildPhase::Base, e))?;
    let key = build.cache_key(&base.id());
    if build.rebuild_from.is_none() {
        if let Ok(existing) = Template::open(&layout, &build.name) {
            if existing.record.build_key.as_deref() == Some(key.as_str()) {
                log(
                    LogLevel::Info,
                    &BuildPhase::Base,
                    "unchanged since the last build: using it (cached)",
                );
                return Ok(existing);
            }
        }
    }
    let work = crate::work_dir::create(&layout.templates(), &build.name)?;
    let result = assemble(node, build, &base, key, &work, log).await;
    let published = match result {
        Ok(rec) => publish_off_thread(&layout, rec, &work).await,
        Err(e) => Err(e),
    };
    let _ = std::fs::remove_dir_all(&work);
    LayeredDisk::prune(node).await;
    if let Ok(t) = &published {
        crate::build::trust_blobs(node, t);
    }
    published.map_err(|e| failed(build, BuildPhase::Finalize, e))
}

fn failed(build: &StepsBuild, phase: BuildPhase, e: Error) -> Error {
    match e {
        e @ Error::BuildFailed { .. } => e,
        other => Error::BuildFailed {
            template: build.name.clone(),
            phase,
            detail: other.to_string(),
        },
    }
}

/// Boots, runs the steps, freezes; returns the record of the frozen VM in
/// `work` (not yet published).
async fn assemble(
    node: &Host,
    build: &StepsBuild,
    base: &Base,
    key: String,
    work: &Path,
    log: &BuildLog,
) -> Result<TemplateRecord> {
    let default_size = base.size(node);
    let size = VmSize {
        vcpus: build.vcpus.unwrap_or(default_size.vcpus),
        memory_mib: build.memory_mib.unwrap_or(default_size.memory_mib),
    };
    let disk = work.join(record::DISK_FILE);
    let memory = work.join(record::MEMORY_FILE);
    let state = work.join(record::STATE_FILE);
    let id = format!("build-{}", build.name);
    log(LogLevel::Info, &BuildPhase::Base, &base.describe());
    let (mut layers, reused) = LayeredDisk::prepare(node, build, base, work, log)
        .await
        .map_err(|e| failed(build, BuildPhase::Base, e))?;
    if reused > 0 {
        log(
            LogLevel::Info,
            &BuildPhase::Base,
            &format!("steps 1-{reused} of {}: cached", build.steps.len()),
        );
    }
    let mut spec = boot_spec(node, &id, work, size, memory.clone(), layers.vm_disk());
    spec.cmdline = node.template_kernel_cmdline();
    let run_dir = spec.run_dir.clone();
    let started = Instant::now();
    let (mut booted, cold_boot_ms) = match boot_until_healthy(node, spec).await {
        Ok(booted) => booted,
        Err(e) => {
            layers.discard();
            return Err(failed(build, BuildPhase::Base, e));
        }
    };
    log(
        LogLevel::Info,
        &BuildPhase::Base,
        &format!("VM booted in {:.1} s", started.elapsed().as_secs_f64()),
    );
    let mut ctx = layers.context();
    let guest = GuestDefaults {
        user: ctx.user.clone(),
        workdir: ctx.workdir.clone(),
    };
    let ran = match claim_build_agent(node, &id, &booted.1, &guest).await {
        Ok(client) => run_all(
            &client,
            booted.0.as_mut(),
            &mut layers,
            build,
            reused,
            &mut ctx,
            log,
        )
        .await
        .map(|()| client),
        Err(e) => Err(failed(build, BuildPhase::Base, e)),
    };
    let ran = match ran {
        Ok(client) => finalize(&client, build, &ctx, log).await,
        Err(e) => Err(e),
    };
    if let Err(e) = ran {
        let (mut vm, slot) = booted;
        let _ = vm.shutdown().await;
        node.release_slot(slot).await;
        layers.discard();
        return Err(e);
    }
    if let Err(e) = freeze(node, &id, booted, &state).await {
        layers.discard();
        return Err(failed(build, BuildPhase::Finalize, e));
    }
    let _ = std::fs::remove_dir_all(&run_dir);
    layers
        .flatten_into(&disk)
        .await
        .map_err(|e| failed(build, BuildPhase::Finalize, e))?;
    log(LogLevel::Info, &BuildPhase::Finalize, "frozen");
    let [memory_file, state_file, disk_file] = file_records(&memory, &state, &disk).await?;
    // A template's steps run in its resumed guest (its kernel state); an
    // image boots the current assets.
    let (image, parent, source_image, guest_assets) = match base {
        Base::Template(t) => (
            t.record.image.clone(),
            Some(t.record.name.clone()),
            None,
            t.record.guest_assets.clone(),
        ),
        Base::Image { image, .. } => (
            image.reference.clone(),
            None,
            Some(SourceImage {
                reference: image.reference.clone(),
                digest: image.digest.clone(),
                config: image.config.clone(),
            }),
            guest_assets_digest_off_thread(node.config.layout())
                .await
                .ok(),
        ),
    };
    let record = TemplateRecord {
        name: build.name.clone(),
        image,
        created_at: chrono::Utc::now(),
        vcpus: size.vcpus,
        memory_mib: size.memory_mib,
        vmm: node.vmm.info().clone(),
        kernel: node.config.layout().kernel().display().to_string(),
        kernel_cmdline: node.template_kernel_cmdline(),
        memory: memory_file,
        state: state_file,
        disk: disk_file,
        cold_boot_ms,
        defaults: TemplateDefaults {
            env: ctx.env.clone(),
            guest: GuestDefaults {
                user: ctx.user.clone(),
                workdir: ctx.workdir.clone(),
            },
            start_cmd: build.start_cmd.clone(),
        },
        parent,
        build_key: Some(key),
        source_image,
        guest_assets,
    };
    record.store(work)?;
    Ok(record)
}

/// Runs the steps after the `reused` ones the disk already holds; each
/// one's result goes into the step cache.
async fn run_all(
    client: &EnvdClient,
    vm: &mut dyn siesta_vmm::VmInstance,
    layers: &mut LayeredDisk,
    build: &StepsBuild,
    reused: usize,
    ctx: &mut StepContext,
    log: &BuildLog,
) -> Result<()> {
    for (i, step) in build.steps.iter().enumerate().skip(reused) {
        let phase = BuildPhase::Step(i + 1);
        log(
            LogLevel::Info,
            &phase,
            &format!("[{}/{}] {}", i + 1, build.steps.len(), step.describe()),
        );
        let ran = async {
            run_step(client, step, ctx, &phase, log).await?;
            if step.writes_disk() {
                shell(client, ctx, "root", "sync", &phase, log).await?;
            }
            layers.commit(&mut *vm, step, ctx).await
        };
        ran.await.map_err(|e| failed(build, phase.clone(), e))?;
    }
    Ok(())
}

async fn run_step(
    client: &EnvdClient,
    step: &Step,
    ctx: &mut StepContext,
    phase: &BuildPhase,
    log: &BuildLog,
) -> Result<()> {
    // The build's own commands (mkdir, useradd, unpacking) run in `/`: the
    // working directory may not exist yet.
    let in_root = StepContext {
        workdir: "/".into(),
        ..ctx.clone()
    };
    match step {
        Step::Run { command, user } => {
            let user = user.clone().unwrap_or_else(|| ctx.user.clone());
            shell(client, ctx, &user, command, phase, log).await
        }
        Step::Env(pairs) => {
            ctx.env.extend(pairs.iter().cloned());
            Ok(())
        }
        Step::Workdir(dir) => {
            let dir = ctx.resolve(dir);
            let script = format!(
                "[ -d {d} ] || {{ mkdir -p {d} && chown {u}: {d}; }}",
                d = quote(&dir),
                u = quote(&ctx.user)
            );
            shell(client, &in_root, "root", &script, phase, log).await?;
            ctx.workdir = dir;
            Ok(())
        }
        Step::User(name) => {
            let script = format!(
                "id -u {u} >/dev/null 2>&1 || useradd -m -s /bin/bash {u}",
                u = quote(name)
            );
            shell(client, &in_root, "root", &script, phase, log).await?;
            ctx.user = name.clone();
            Ok(())
        }
        Step::Copy {
            archive,
            sources,
            digest,
            dest,
            owner,
            mode,
        } => {
            let guest_archive =
                format!("/tmp/.siesta-copy-{}.tar", &digest[..digest.len().min(16)]);
            // Streamed from the file: an archive may be gigabytes.
            client.upload_file(&guest_archive, "root", archive).await?;
            let owner = owner.clone().unwrap_or_else(|| ctx.user.clone());
            let mode = mode.map(|m| format!("{m:o}")).unwrap_or_default();
            let script = copy_script(
                &guest_archive,
                sources,
                &ctx.resolve(dest),
                dest.ends_with('/'),
                &owner,
                &mode,
            );
            shell(client, &in_root, "root", &script, phase, log).await
        }
    }
}

/// Unpacks the archive in a scratch directory and copies what `sources`
/// match there to `dest` as Docker's COPY does: a directory's contents go
/// into `dest`; with several matches, or a `dest` ending in `/` or naming a
/// directory, files go into `dest`; a single file otherwise becomes `dest`.
/// Only what was copied (and `dest` itself when the COPY created it) gets
/// `owner` and `mode`.
fn copy_script(
    archive: &str,
    sources: &[String],
    dest: &str,
    into_dir: bool,
    owner: &str,
    mode: &str,
) -> String {
    let patterns: Vec<String> = sources
        .iter()
        .map(|s| quote(s.trim_start_matches("./")))
        .collect();
    format!(
        r#"set -e
archive={archive}; dest={dest}; owner={owner}; mode={mode}
patterns=({patterns})
ctx="$archive.d"; rm -rf "$ctx"; mkdir -p "$ctx"
tar -xf "$archive" -C "$ctx" --no-same-owner
existed=0; if [ -e "$dest" ] || [ -L "$dest" ]; then existed=1; fi
cd "$ctx"
shopt -s dotglob
entries=()
for p in "${{patterns[@]}}"; do
  # (no process substitution: a minimal guest may lack /dev/fd)
  list=$(compgen -G "$p" || true)
  m=(); [ -z "$list" ] || mapfile -t m <<< "$list"
  if [ ${{#m[@]}} -eq 0 ]; then echo "COPY: nothing in the build context matches $p" >&2; exit 1; fi
  entries+=("${{m[@]}}")
done
into={into}
[ ${{#entries[@]}} -gt 1 ] && into=1
[ -d "$dest" ] && into=1
targets=()
for e in "${{entries[@]}}"; do
  e="${{e%/}}"
  if [ -d "$e" ] && [ ! -L "$e" ]; then
    mkdir -p "$dest"
    for c in "$e"/*; do targets+=("$dest/${{c##*/}}"); done
    cp -a "$e"/. "$dest"/
  elif [ $into = 1 ]; then
    mkdir -p "$dest"; cp -a "$e" "$dest"/; targets+=("$dest/${{e##*/}}")
  else
    mkdir -p "$(dirname "$dest")"; cp -a "$e" "$dest"; targets+=("$dest")
  fi
done
[ -e "$dest" ] || mkdir -p "$dest"
# A destination the COPY created is wholly its own.
[ $existed = 1 ] || targets=("$dest")
if [ ${{#targets[@]}} -gt 0 ]; then
  chown -R -h "$owner" "${{targets[@]}}"
  [ -z "$mode" ] || find "${{targets[@]}}" ! -type l -exec chmod "$mode" {{}} +
fi
cd /; rm -rf "$ctx" "$archive""#,
        archive = quote(archive),
        dest = quote(dest),
        owner = quote(owner),
        mode = quote(mode),
        patterns = patterns.join(" "),
        into = u8::from(into_dir),
    )
}

/// Starts the start command in the background (detached from the agent,
/// so it outlives the call) and runs the ready check until it succeeds;
/// then flushes the guest's file systems.
async fn finalize(
    client: &EnvdClient,
    build: &StepsBuild,
    ctx: &StepContext,
    log: &BuildLog,
) -> Result<()> {
    let phase = BuildPhase::Finalize;
    let fail = |e| failed(build, BuildPhase::Finalize, e);
    let guest = GuestDefaults {
        user: ctx.user.clone(),
        workdir: ctx.workdir.clone(),
    };
    // The start command runs under the template's defaults; the build's
    // token stays until the very last call.
    let defaults = siesta_envd_client::InitParams::new(None, Default::default(), &guest);
    client.init(&defaults).await.map_err(|e| fail(e.into()))?;
    if let Some(start) = &build.start_cmd {
        log(LogLevel::Info, &phase, &format!("start command: {start}"));
        let mut c = ctx.clone();
        c.env.insert("SIESTA_START_CMD".into(), start.clone());
        let detach = "setsid -f bash -l -c \"$SIESTA_START_CMD\" </dev/null >/dev/null 2>&1";
        shell(client, &c, &ctx.user, detach, &phase, log)
            .await
            .map_err(fail)?;
    }
    if let Some(ready) = &build.ready_cmd {
        log(
            LogLevel::Info,
            &phase,
            &format!("waiting for the ready check: {ready}"),
        );
        wait_ready(client, ctx, ready).await.map_err(fail)?;
    }
    shell(client, ctx, "root", "sync", &phase, log)
        .await
        .map_err(fail)?;
    // Last: clears the token, right before the freeze.
    init_before_freeze(client, &guest).await.map_err(fail)
}

async fn wait_ready(client: &EnvdClient, ctx: &StepContext, ready: &str) -> Result<()> {
    let started = Instant::now();
    let mut last = String::new();
    while started.elapsed() < READY_TIMEOUT {
        let out = client
            .run_with(
                "/bin/bash",
                &["-l", "-c", ready],
                &options(ctx, &ctx.user),
                |_, _| {},
            )
            .await?;
        if out.exit_code == 0 {
            return Ok(());
        }
        last = tail(&out.stdout, &out.stderr);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Err(Error::Invalid(format!(
        "the ready check `{ready}` did not succeed within {} s{}",
        READY_TIMEOUT.as_secs(),
        if last.is_empty() {
            String::new()
        } else {
            format!("; its last output: {last}")
        }
    )))
}

fn options(ctx: &StepContext, user: &str) -> ExecOptions {
    ExecOptions {
        user: Some(user.to_string()),
        envs: ctx.env.clone().into_iter().collect(),
        cwd: Some(ctx.workdir.clone()),
    }
}

/// Runs `script` with bash as `user` in the step context, logging its
/// output line by line; a non-zero exit is an error with the output's tail.
async fn shell(
    client: &EnvdClient,
    ctx: &StepContext,
    user: &str,
    script: &str,
    phase: &BuildPhase,
    log: &BuildLog,
) -> Result<()> {
    let opts = options(ctx, user);
    let mut pending = String::new();
    let out = client
        .run_with("/bin/bash", &["-l", "-c", script], &opts, |_, bytes| {
            pending.push_str(&String::from_utf8_lossy(bytes));
            while let Some(nl) = pending.find('\n') {
                let line: String = pending.drain(..=nl).collect();
                log(LogLevel::Info, phase, line.trim_end());
            }
        })
        .await?;
    if !pending.is_empty() {
        log(LogLevel::Info, phase, pending.trim_end());
    }
    if out.exit_code != 0 {
        let what = if script.contains('\n') {
            format!("{} (as {user})", phase_label(phase))
        } else {
            format!("`{}` (as {user})", first_line(script))
        };
        return Err(Error::Command {
            what,
            detail: format!(
                "exit code {}: {}",
                out.exit_code,
                tail(&out.stdout, &out.stderr)
            ),
        });
    }
    Ok(())
}

fn phase_label(phase: &BuildPhase) -> String {
    match phase {
        BuildPhase::Step(n) => format!("step {n}"),
        other => other.to_string(),
    }
}

fn first_line(s: &str) -> &str {
    let line = s.lines().next().unwrap_or("");
    if line.len() > 120 {
        let mut end = 120;
        while !line.is_char_boundary(end) {
            end -= 1;
        }
        &line[..end]
    } else {
        line
    }
}

/// The last lines of a command's output, for an error message.
fn tail(stdout: &[u8], stderr: &[u8]) -> String {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(stdout),
        String::from_utf8_lossy(stderr)
    );
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let tail = lines[lines.len().saturating_sub(10)..].join("\n");
    if tail.is_empty() {
        "no output".into()
    } else {
        tail
    }
}

/// `s` as one single-quoted shell word.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_quotes() {
        assert_eq!(quote("a'b"), r"'a'\''b'");
        assert_eq!(quote(""), "''");
    }

    #[test]
    fn tail_keeps_the_last_lines() {
        let out: String = (0..20).map(|i| format!("line {i}\n")).collect();
        let t = tail(out.as_bytes(), b"boom\n");
        assert!(t.ends_with("line 19\nboom"), "{t}");
        assert!(!t.contains("line 9\n"));
        assert_eq!(tail(b"", b""), "no output");
    }

    #[test]
    fn phases_print_as_e2b_names_them() {
        assert_eq!(BuildPhase::Base.to_string(), "base");
        assert_eq!(BuildPhase::Step(3).to_string(), "3");
        assert_eq!(BuildPhase::Finalize.to_string(), "finalize");
    }
}
