//! The served OpenAPI document (`docs/openapi.yaml`, served at
//! `/openapi.yaml`) names exactly the routes the router is built from: no
//! route undocumented, no documented route missing.

use std::collections::BTreeSet;

use super::{control_routes, public_routes};

const DOCUMENT: &str = include_str!("../../../../docs/openapi.yaml");

/// `{id}`, `{buildID}`, ...: parameter names do not matter, only where
/// parameters are.
fn shape(path: &str) -> String {
    path.split('/')
        .map(|part| if part.starts_with('{') { "{}" } else { part })
        .collect::<Vec<_>>()
        .join("/")
}

/// (METHOD, path shape) of every operation under `paths:`. The document
/// keeps one style: paths indented two spaces, methods four.
fn documented() -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    let mut in_paths = false;
    let mut path = None;
    for line in DOCUMENT.lines() {
        if !line.starts_with(' ') {
            in_paths = line.trim_end() == "paths:";
            continue;
        }
        if !in_paths {
            continue;
        }
        if let Some(p) = line.strip_prefix("  /").and_then(|p| p.strip_suffix(':')) {
            path = Some(shape(&format!("/{p}")));
        } else if let Some(m) = line.strip_prefix("    ").and_then(|m| m.split(':').next()) {
            let method = m.trim();
            let known = ["get", "post", "put", "patch", "delete"];
            if let (Some(p), true) = (&path, known.contains(&method)) {
                out.insert((method.to_uppercase(), p.clone()));
            }
        }
    }
    out
}

fn routed() -> BTreeSet<(String, String)> {
    control_routes()
        .into_iter()
        .chain(public_routes())
        .flat_map(|r| {
            let path = shape(r.path);
            r.methods
                .into_iter()
                .map(move |m| (m.to_string(), path.clone()))
        })
        .collect()
}

#[test]
fn openapi_document_names_every_route() {
    let (doc, routes) = (documented(), routed());
    let undocumented: Vec<_> = routes.difference(&doc).collect();
    let unrouted: Vec<_> = doc.difference(&routes).collect();
    assert!(
        undocumented.is_empty() && unrouted.is_empty(),
        "routes missing from docs/openapi.yaml: {undocumented:?}; documented but not routed: {unrouted:?}"
    );
    assert!(routes.len() > 40, "the inventory is suspiciously small");
}
