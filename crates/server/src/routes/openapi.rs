//! The API's OpenAPI 3 document, made from the code: every path and method
//! comes from the `#[utoipa::path]` of the handler the router calls (the
//! router is built from the same `routes!` calls, so neither can name a
//! route the other lacks), every schema from the request and response
//! types (`ToSchema`). It is served at `/openapi.yaml`, and
//! `docs/openapi.yaml` is a copy that a test keeps equal to it
//! (`siesta openapi > docs/openapi.yaml` writes it).

use std::sync::OnceLock;

use utoipa::openapi::path::Operation;
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::OpenApi as Document;
use utoipa::{Modify, OpenApi};

use super::{control_routes, public_routes};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "siesta node API",
        description = "The control API of a siesta node. It follows the E2B wire contract so the \
official E2B SDKs work unmodified (E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY). Every control \
endpoint needs the node's API key in `X-API-KEY`. Errors are JSON `{\"code\": <int>, \
\"message\": <str>}`. Requests carrying `E2b-Sandbox-Id` (or a `{port}-{sandboxID}.{domain}` \
host) are proxied to the sandbox instead (the envd front door). This document is generated \
from the server's code.",
        license(name = "Apache-2.0"),
    ),
    servers((url = "http://127.0.0.1:3000")),
    security(("apiKey" = [])),
    components(schemas(super::model::Error)),
    modifiers(&SecuritySchemes),
)]
struct Base;

/// `apiKey` (the node's key) and `volumeToken` (a volume's own token).
struct SecuritySchemes;

impl Modify for SecuritySchemes {
    fn modify(&self, doc: &mut Document) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "apiKey",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::new("X-API-KEY"))),
        );
        let bearer = HttpBuilder::new()
            .scheme(HttpAuthScheme::Bearer)
            .description(Some("the volume's own token (POST or GET /volumes/{id})"))
            .build();
        components.add_security_scheme("volumeToken", SecurityScheme::Http(bearer));
    }
}

/// The whole document: the base, then every route's operation.
pub fn document() -> Document {
    let mut doc = Base::openapi();
    doc.merge(control_routes().into_openapi());
    doc.merge(public_routes().into_openapi());
    unique_operation_ids(&mut doc);
    doc
}

/// utoipa names an operation after its handler, and several modules have a
/// `list` or a `create`: `{tag}_{handler}`, and `_{method}` after that
/// where one handler answers several methods.
fn unique_operation_ids(doc: &mut Document) {
    let mut seen = std::collections::HashMap::<String, usize>::new();
    let mut operations: Vec<(&'static str, &mut Operation)> = Vec::new();
    for item in doc.paths.paths.values_mut() {
        let methods = [
            ("get", &mut item.get),
            ("post", &mut item.post),
            ("put", &mut item.put),
            ("patch", &mut item.patch),
            ("delete", &mut item.delete),
        ];
        for (method, op) in methods {
            if let Some(op) = op.as_mut() {
                operations.push((method, op));
            }
        }
    }
    for (_, op) in operations.iter_mut() {
        let tag = op.tags.as_ref().and_then(|t| t.first()).cloned();
        let name = op.operation_id.clone().unwrap_or_default();
        let id = tag.map_or(name.clone(), |t| format!("{t}_{name}"));
        *seen.entry(id.clone()).or_default() += 1;
        op.operation_id = Some(id);
    }
    for (method, op) in operations {
        if let Some(id) = op.operation_id.as_mut() {
            if seen.get(id.as_str()).is_some_and(|n| *n > 1) {
                *id = format!("{id}_{method}");
            }
        }
    }
}

/// The document in YAML, made once.
pub fn yaml() -> &'static str {
    static YAML: OnceLock<String> = OnceLock::new();
    YAML.get_or_init(|| {
        document()
            .to_yaml()
            .unwrap_or_else(|e| format!("# the OpenAPI document could not be written: {e}\n"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHECKED_IN: &str = include_str!("../../../../docs/openapi.yaml");

    /// The copy readers and schemathesis use is the served document.
    #[test]
    fn docs_openapi_yaml_is_the_generated_document() {
        assert!(
            CHECKED_IN == yaml(),
            "docs/openapi.yaml differs from the document the code makes: \
             run `target/release/siesta openapi > docs/openapi.yaml` after building"
        );
    }

    #[test]
    fn every_operation_has_responses_and_the_inventory_is_whole() {
        let doc = document();
        let mut operations = 0;
        for (path, item) in &doc.paths.paths {
            let ops = [&item.get, &item.post, &item.put, &item.patch, &item.delete];
            for op in ops.into_iter().flatten() {
                operations += 1;
                assert!(
                    !op.responses.responses.is_empty(),
                    "{path}: an operation without documented responses"
                );
            }
        }
        // 47 operations on 38 paths when this was written.
        assert!(operations >= 47, "only {operations} operations documented");
    }
}
