//! Options of the E2B API that siesta does not implement yet. Each is
//! refused with a 400 that names the field, and only when the caller sets
//! it to something other than what the SDK sends by default: accepting it
//! and doing something else would surprise the caller later (a sandbox
//! without its volume, a pause that kept what was asked to be dropped).

use axum::http::StatusCode;
use serde_json::Value;

use crate::error::ApiError;

/// `memory: false` (a filesystem-only pause, snapshot or reboot-on-resume
/// connect) in the body of `what`.
pub fn memory_kept(memory: Option<bool>, what: &str) -> Result<(), ApiError> {
    if memory == Some(false) {
        return Err(refuse(&format!(
            "{what}: memory=false (filesystem only) is not supported yet: this server always \
             keeps memory and running processes; leave it unset"
        )));
    }
    Ok(())
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
        assert!(memory_kept(None, "pause").is_ok());
        assert!(memory_kept(Some(true), "pause").is_ok());
        let err = memory_kept(Some(false), "pause").unwrap_err();
        assert!(
            err.message.starts_with("pause: memory=false"),
            "{}",
            err.message
        );
        assert!(unset("iam", None).is_ok());
        assert!(unset("iam", Some(&Value::Null)).is_ok());
        assert!(unset("iam", Some(&serde_json::json!({}))).is_ok());
        let err = unset("iam", Some(&serde_json::json!({"x": 1}))).unwrap_err();
        assert_eq!(err.status, StatusCode::BAD_REQUEST);
        assert!(err.message.contains("iam is not supported"));
    }
}
