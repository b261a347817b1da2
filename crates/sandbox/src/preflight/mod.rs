//! Preflight: what a node needs before it can serve, checked up front.
//!
//! `siesta doctor` prints these checks and `siesta serve` refuses to start
//! when one of them fails, so a missing host tool is one clear message at
//! start instead of a 500 on every create. Each check says what it found
//! and, when something is wrong, what to do about it.
//!
//! The host tools (and the Debian package of each) are listed once, in
//! [`HOST_TOOLS`]; the error a request gets when a tool vanishes at run time
//! ([`crate::Error::MissingTool`]) names the same package.

mod checks;

use serde::Serialize;

pub use siesta_host::tools::{find_on_path, package_of, HostTool, HOST_TOOLS};

use crate::config::NodeConfig;

/// How one check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Present and working.
    Ok,
    /// The server can run, but something users will want is missing (the
    /// default template, its startup manifest, guest assets, disk headroom).
    Warn,
    /// The server cannot do its job without it: `serve` refuses to start.
    Fail,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "FAIL",
        }
    }
}

/// One line of the report.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// Short name of what was checked (`qemu-img`, `netns`, `template`...).
    pub name: String,
    pub status: Status,
    /// What was found (a version, a path, a size) or what is wrong.
    pub detail: String,
    /// What to do about it; `None` when nothing needs doing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Check {
    pub fn ok(name: impl Into<String>, detail: impl Into<String>) -> Self {
        Self::new(name, Status::Ok, detail, None::<String>)
    }
    pub fn warn(
        name: impl Into<String>,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Self::new(name, Status::Warn, detail, Some(fix))
    }
    pub fn fail(
        name: impl Into<String>,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Self::new(name, Status::Fail, detail, Some(fix))
    }
    fn new(
        name: impl Into<String>,
        status: Status,
        detail: impl Into<String>,
        fix: Option<impl Into<String>>,
    ) -> Self {
        Self {
            name: name.into(),
            status,
            detail: detail.into(),
            fix: fix.map(Into::into),
        }
    }

    /// `ok    qemu-img     qemu-img version 7.2.22` or, when something is
    /// wrong, the same with `: what to do` after the detail.
    pub fn line(&self) -> String {
        let mut line = format!(
            "{:<5} {:<14} {}",
            self.status.as_str(),
            self.name,
            self.detail
        );
        if let Some(fix) = &self.fix {
            line.push_str(": ");
            line.push_str(fix);
        }
        line
    }
}

/// Every check, in the order they ran.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub checks: Vec<Check>,
}

impl Report {
    /// True when nothing failed (warnings allowed).
    pub fn ready(&self) -> bool {
        self.failures().next().is_none()
    }

    pub fn failures(&self) -> impl Iterator<Item = &Check> {
        self.checks.iter().filter(|c| c.status == Status::Fail)
    }

    pub fn warnings(&self) -> impl Iterator<Item = &Check> {
        self.checks.iter().filter(|c| c.status == Status::Warn)
    }

    /// One line per check.
    pub fn text(&self) -> String {
        let mut out = String::new();
        for c in &self.checks {
            out.push_str(&c.line());
            out.push('\n');
        }
        out
    }
}

/// What to check besides the host: the template sandboxes are created from
/// by default, and how much free disk is enough.
#[derive(Debug, Clone)]
pub struct PreflightOptions {
    pub default_template: String,
    /// Below this, `disk` fails (a pause or a template build would not fit).
    pub min_free_bytes: u64,
    /// Below this, `disk` warns.
    pub low_free_bytes: u64,
}

impl Default for PreflightOptions {
    fn default() -> Self {
        Self {
            default_template: "base".into(),
            min_free_bytes: 1 << 30,
            low_free_bytes: 4 << 30,
        }
    }
}

/// Runs every check for a node configured as `config`. Cheap (tens of
/// milliseconds): `serve` runs it on every start.
pub fn run(config: &NodeConfig, opts: &PreflightOptions) -> Report {
    let mut checks = Vec::new();
    let qemu = checks::qemu(config);
    let vmm_info = qemu.1.clone();
    checks.push(qemu.0);
    for tool in HOST_TOOLS
        .iter()
        .filter(|t| t.command != "qemu-system-x86_64")
    {
        checks.push(checks::tool(tool));
    }
    checks.push(checks::netns());
    checks.push(checks::accelerator(config));
    checks.push(checks::isolation(config));
    checks.push(checks::vmm_cgroups());
    checks.push(checks::vmm_users(config));
    checks.push(checks::assets(config));
    checks.push(checks::template(
        config,
        &opts.default_template,
        vmm_info.as_ref(),
    ));
    checks.push(checks::disk(config, opts));
    checks.push(checks::database(config));
    checks.push(checks::memory_return(config));
    Report { checks }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_names_the_fix_only_when_there_is_one() {
        assert_eq!(
            Check::ok("ip", "ip 6.1").line(),
            "ok    ip             ip 6.1"
        );
        let line = Check::fail("qemu-img", "not found on PATH", "install qemu-utils").line();
        assert_eq!(
            line,
            "FAIL  qemu-img       not found on PATH: install qemu-utils"
        );
    }

    #[test]
    fn a_report_is_ready_unless_something_failed() {
        let mut report = Report {
            checks: vec![Check::ok("a", "x"), Check::warn("b", "y", "z")],
        };
        assert!(report.ready());
        report.checks.push(Check::fail("c", "gone", "install it"));
        assert!(!report.ready());
        assert_eq!(report.failures().count(), 1);
        assert_eq!(report.warnings().count(), 1);
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["checks"][2]["status"], "fail");
        assert_eq!(json["checks"][0].get("fix"), None);
    }
}
