//! The dependency rules, checked on the source (issue 42; see
//! docs/architecture.md, "Dependency rules"):
//!
//! - **Crates depend only on the floors below them**: each crate's
//!   `siesta-*` dependencies are the ones [`CRATE_RULES`] allows.
//! - **The launch path never reaches the manager or the store.** `resume`
//!   (what turns a template or a paused sandbox into a running VM) and every
//!   module it imports, transitively, must not import `manager`, `store`,
//!   `operation`, `lifecycle`, `recovery`, `running`, `handover`,
//!   `idempotent` or `snapshots`: the launch path is handed what it needs
//!   and gives back a running VM; only the manager writes rows.
//!
//! `error` is left out of the walk: it names every module's error type (a
//! `From` for each) without running any of their code.
//!
//! A module is a top-level module of `src/` (a file, or a folder with all
//! it holds); an import is any `crate::name` outside comments and tests.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Where the launch path starts.
const LAUNCH: &str = "resume";

/// What the launch path must never reach.
const ABOVE_LAUNCH: &[&str] = &[
    "manager",
    "store",
    "operation",
    "lifecycle",
    "recovery",
    "running",
    "handover",
    "idempotent",
    "snapshots",
];

/// Modules whose imports are not followed (see the module docs).
const NOT_FOLLOWED: &[&str] = &["error"];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Each top-level module with the files it is made of.
fn modules() -> BTreeMap<String, Vec<PathBuf>> {
    let mut modules = BTreeMap::new();
    for entry in std::fs::read_dir(src()).expect("src/") {
        let path = entry.expect("directory entry").path();
        let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        if stem == "lib" {
            continue;
        }
        let mut files = Vec::new();
        if path.is_dir() {
            rust_files(&path, &mut files);
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path.clone());
        } else {
            continue;
        }
        modules.insert(stem.to_string(), files);
    }
    modules
}

/// The code of a file, less comments and its `#[cfg(test)]` part.
fn code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    without_comments_and_tests(&text)
}

fn without_comments_and_tests(text: &str) -> String {
    let text = text.split("#[cfg(test)]").next().unwrap_or_default();
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The top-level modules `code` names as `crate::m` or `crate::{m, ...}`.
fn imports(code: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // Top-level names of the group: after `{` and each `,` at depth 0.
            let mut depth = 0;
            let mut start = true;
            for (i, c) in group.char_indices() {
                if start && !c.is_whitespace() {
                    found.insert(ident(&group[i..]).to_string());
                    start = false;
                }
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => start = true,
                    _ => {}
                }
            }
        } else {
            found.insert(ident(rest).to_string());
        }
    }
    found
}

#[test]
fn the_launch_path_never_reaches_the_manager_or_the_store() {
    let modules = modules();
    assert!(modules.contains_key(LAUNCH), "no src/{LAUNCH}.rs");
    for name in ABOVE_LAUNCH {
        assert!(
            modules.contains_key(*name),
            "rule names unknown module {name}"
        );
    }
    let deps: BTreeMap<&str, BTreeSet<String>> = modules
        .iter()
        .map(|(name, files)| {
            let mut all: BTreeSet<String> = files.iter().flat_map(|f| imports(&code(f))).collect();
            all.retain(|m| m != name && modules.contains_key(m));
            (name.as_str(), all)
        })
        .collect();
    // Walk from the launch path, remembering how each module was reached.
    let mut reached_from: BTreeMap<String, String> = BTreeMap::new();
    let mut todo = vec![LAUNCH.to_string()];
    while let Some(module) = todo.pop() {
        if NOT_FOLLOWED.contains(&module.as_str()) {
            continue;
        }
        for dep in &deps[module.as_str()] {
            if dep != LAUNCH && !reached_from.contains_key(dep) {
                reached_from.insert(dep.clone(), module.clone());
                todo.push(dep.clone());
            }
        }
    }
    let broken: Vec<String> = ABOVE_LAUNCH
        .iter()
        .filter(|m| reached_from.contains_key(**m))
        .map(|m| {
            let mut chain = vec![m.to_string()];
            while let Some(from) = reached_from.get(chain.last().map_or("", String::as_str)) {
                chain.push(from.clone());
                if from == LAUNCH {
                    break;
                }
            }
            chain.reverse();
            chain.join(" -> ")
        })
        .collect();
    assert!(
        broken.is_empty(),
        "the launch path reaches modules above it:\n{}",
        broken.join("\n")
    );
}

#[test]
fn imports_are_read_from_paths_and_groups() {
    let found = imports("use crate::a::X;\nuse crate::{b, c::{D, E}, f};\nlet _ = crate::g::h();");
    let want: BTreeSet<String> = ["a", "b", "c", "f", "g"].map(String::from).into();
    assert_eq!(found, want);
    let commented = "/// See [`crate::manager`].\nfn x() {}\n#[cfg(test)]\nuse crate::store;";
    assert!(imports(&without_comments_and_tests(commented)).is_empty());
}

/// Each crate of the workspace and the siesta crates it may depend on
/// (docs/architecture.md draws the same picture). Cargo already refuses a
/// circle; this keeps the floors: a crate below `siesta-sandbox` never
/// knows sandboxes, the agent client knows no node, and a new dependency
/// is a decision someone wrote down here.
const CRATE_RULES: &[(&str, &[&str])] = &[
    ("envd-proto", &[]),
    ("vmm", &[]),
    ("net", &[]),
    ("snapshot", &[]),
    ("image", &[]),
    ("volume", &[]),
    ("agent", &["envd-proto"]),
    ("envd-client", &["envd-proto"]),
    (
        "host",
        &["vmm", "net", "image", "envd-client", "envd-proto"],
    ),
    (
        "template",
        &["host", "envd-client", "vmm", "net", "snapshot", "image"],
    ),
    ("tier", &["host", "snapshot", "template"]),
    (
        "sandbox",
        &[
            "tier",
            "template",
            "host",
            "envd-client",
            "envd-proto",
            "vmm",
            "net",
            "snapshot",
            "image",
            "volume",
        ],
    ),
    ("cluster", &["sandbox"]),
    (
        "server",
        &[
            "cluster",
            "sandbox",
            "template",
            "volume",
            "image",
            "net",
            "envd-proto",
        ],
    ),
    (
        "cli",
        &[
            "server",
            "cluster",
            "sandbox",
            "tier",
            "template",
            "host",
            "envd-client",
            "volume",
            "image",
            "snapshot",
            "net",
            "vmm",
            "envd-proto",
        ],
    ),
];

/// The `siesta-*` crates in the `[dependencies]` table of `manifest` (not
/// dev-dependencies: a test may reach anywhere).
fn siesta_dependencies(manifest: &str) -> BTreeSet<String> {
    let mut in_dependencies = false;
    let mut found = BTreeSet::new();
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_dependencies = line == "[dependencies]";
        } else if let Some(rest) = line.strip_prefix("siesta-").filter(|_| in_dependencies) {
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
                .unwrap_or(rest.len());
            found.insert(rest[..end].to_string());
        }
    }
    found
}

#[test]
fn crates_depend_only_on_the_floors_below_them() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut seen = BTreeSet::new();
    let mut broken = Vec::new();
    for entry in std::fs::read_dir(&crates).expect("crates/") {
        let dir = entry.expect("directory entry").path();
        let manifest = dir.join("Cargo.toml");
        let Ok(text) = std::fs::read_to_string(&manifest) else {
            continue;
        };
        let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let Some((_, allowed)) = CRATE_RULES.iter().find(|(c, _)| *c == name) else {
            broken.push(format!("crates/{name} has no rule in CRATE_RULES"));
            continue;
        };
        seen.insert(name.to_string());
        for dep in siesta_dependencies(&text) {
            if !allowed.contains(&dep.as_str()) {
                broken.push(format!("siesta-{name} depends on siesta-{dep}"));
            }
        }
    }
    for (name, _) in CRATE_RULES {
        assert!(
            seen.contains(*name),
            "CRATE_RULES names crates/{name}, which is not there"
        );
    }
    assert!(
        broken.is_empty(),
        "dependency rules broken:\n{}",
        broken.join("\n")
    );
}

#[test]
fn dependencies_are_read_from_the_dependencies_table_only() {
    let manifest = "[package]\nname = \"siesta-x\"\n[dependencies]\nsiesta-host.workspace = true\n\
                    siesta-vmm = { path = \"../vmm\" }\ntokio = \"1\"\n[dev-dependencies]\nsiesta-server.workspace = true\n";
    let want: BTreeSet<String> = ["host", "vmm"].map(String::from).into();
    assert_eq!(siesta_dependencies(manifest), want);
}
