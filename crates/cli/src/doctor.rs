//! `siesta doctor`: checks what this node needs, one line per check.

use std::process::ExitCode;

use siesta_sandbox::preflight::{self, Check, PreflightOptions, Report};
use siesta_sandbox::NodeConfig;

#[derive(clap::Args)]
pub struct DoctorArgs {
    /// The template sandboxes are created from by default.
    #[arg(long, default_value = "base")]
    template: String,
    /// `text` (one line per check) or `json` (for scripts).
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    output: String,
}

/// Exits 0 when the server could run here (warnings allowed), 1 otherwise.
pub fn run(args: DoctorArgs) -> anyhow::Result<ExitCode> {
    let config = NodeConfig::from_env().map_err(anyhow::Error::msg)?;
    let mut report = preflight::run(&config, &options(&args.template));
    report.checks.push(home_access(&config.home));
    if args.output == "json" {
        let json = serde_json::json!({
            "ready": report.ready(),
            "home": config.home,
            "checks": report.checks,
        });
        println!("{}", serde_json::to_string_pretty(&json)?);
    } else {
        print!("{}", report.text());
        println!("{}", summary(&report));
    }
    Ok(if report.ready() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

pub fn options(template: &str) -> PreflightOptions {
    PreflightOptions {
        default_template: template.to_string(),
        ..PreflightOptions::default()
    }
}

/// The last line: ready, or how many checks failed.
pub fn summary(report: &Report) -> String {
    let failed = report.failures().count();
    let warned = report.warnings().count();
    match (failed, warned) {
        (0, 0) => "ready: every check passed".to_string(),
        (0, w) => format!("ready, with {w} warning(s)"),
        (f, _) => format!("not ready: {f} check(s) failed"),
    }
}

/// Whether other users can reach into the home, where every sandbox's
/// tokens are. A warning: `siesta serve` closes it (0700) when it starts.
fn home_access(home: &std::path::Path) -> Check {
    match crate::private_home::open_bits(home) {
        Ok(0) => Check::ok("home-access", format!("{} is 0700", home.display())),
        Ok(bits) => Check::warn(
            "home-access",
            format!(
                "{} lets other users in (group/other bits {bits:03o}): they could read every sandbox's tokens",
                home.display()
            ),
            format!("chmod 700 {} (siesta serve does it when it starts)", home.display()),
        ),
        // No home yet: the first server makes it 0700.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Check::ok("home-access", format!("{} does not exist yet", home.display()))
        }
        Err(e) => Check::warn("home-access", e.to_string(), "check the home's owner and mode"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use siesta_sandbox::preflight::Status;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_home_others_can_enter_is_reported() {
        let home = tempfile::tempdir().unwrap();
        let set = |mode| {
            std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(mode)).unwrap()
        };
        set(0o755);
        let check = home_access(home.path());
        assert_eq!(check.status, Status::Warn, "{}", check.line());
        assert!(check.line().contains("055"), "{}", check.line());
        set(0o700);
        assert_eq!(home_access(home.path()).status, Status::Ok);
        assert_eq!(home_access(&home.path().join("none")).status, Status::Ok);
    }
}
