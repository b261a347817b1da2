//! `siesta doctor`: checks what this node needs, one line per check.

use std::process::ExitCode;

use siesta_sandbox::preflight::{self, PreflightOptions, Report};
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
    let report = preflight::run(&config, &options(&args.template));
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
