//! Options of the E2B API that siesta does not implement yet. Each is
//! refused with a 400 that names the field, and only when the caller sets
//! it to something other than what the SDK sends by default: accepting it
//! and doing something else would surprise the caller later (a secret
//! that is not there, credentials that are not injected).

use axum::http::StatusCode;
use serde_json::Value;

use crate::error::ApiError;

/// E2B's secrets (`Secret.create`, ...): none are stored here, so a list is
/// empty, a look-up finds nothing, and storing one is refused by name.
#[utoipa::path(
    get, path = "/secrets", tag = "secrets",
    responses((status = 200, description = "an empty array", body = [Object])),
)]
pub async fn secrets_list() -> axum::Json<Vec<Value>> {
    axum::Json(Vec::new())
}

/// Store a secret: not supported by this server; refused.
#[utoipa::path(
    post, path = "/secrets", tag = "secrets",
    request_body(content = Object, description = "E2B's secret"),
    responses((status = 400, description = "not supported", body = super::model::Error)),
)]
pub async fn secrets_store() -> ApiError {
    refuse(
        "secrets are not supported by this server yet (nothing was stored); \
         pass values to the sandbox as envs instead",
    )
}

/// Get, update or delete a secret: none exist here.
#[utoipa::path(
    method(get, post, delete), path = "/secrets/{id}", tag = "secrets",
    params(("id" = String, Path)),
    responses((status = 404, description = "no such secret", body = super::model::Error)),
)]
pub async fn secret_missing() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "secret not found: this server stores no secrets (not supported yet)",
    )
}

/// An option that must be absent, `null`, or empty.
pub fn unset(field: &str, value: Option<&Value>) -> Result<(), ApiError> {
    let set = match value {
        None | Some(Value::Null) => false,
        Some(Value::Object(o)) => !o.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(_) => true,
    };
    if set {
        return Err(refuse(&format!(
            "{field} is not supported by this server yet; leave it unset"
        )));
    }
    Ok(())
}

fn refuse(message: &str) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, message.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_is_set_is_refused() {
        assert!(unset("iam", None).is_ok());
        assert!(unset("iam", Some(&Value::Null)).is_ok());
        assert!(unset("iam", Some(&serde_json::json!({}))).is_ok());
        let err = unset("iam", Some(&serde_json::json!({"x": 1}))).unwrap_err();
        assert_eq!(err.status, StatusCode::BAD_REQUEST);
        assert!(err.message.contains("iam is not supported"));
    }
}
