//! The one way Tessera adds or removes its finalizers: JSON patches guarded by a
//! `test` operation, so a patch applies only to the object as it was read (the API
//! server answers 422 otherwise, and the next reconcile reads again). Server-side
//! apply would take ownership of the whole list; a merge patch would replace it.

use serde_json::json;

/// The patch that appends `finalizer` to an object that has `finalizers` at
/// `resource_version`; `None` when it is there already.
pub fn add_patch(
    finalizers: &[String],
    resource_version: Option<&str>,
    finalizer: &str,
) -> Option<json_patch::Patch> {
    if finalizers.iter().any(|f| f == finalizer) {
        return None;
    }
    let add = if finalizers.is_empty() {
        json!({"op": "add", "path": "/metadata/finalizers", "value": [finalizer]})
    } else {
        json!({"op": "add", "path": "/metadata/finalizers/-", "value": finalizer})
    };
    let test =
        json!({"op": "test", "path": "/metadata/resourceVersion", "value": resource_version});
    Some(serde_json::from_value(json!([test, add])).expect("a well-formed JSON patch"))
}

/// The patch that removes `finalizer` from an object that has `finalizers`, if it is
/// still at the index it was read at; `None` when it is not there.
pub fn remove_patch(finalizers: &[String], finalizer: &str) -> Option<json_patch::Patch> {
    let idx = finalizers.iter().position(|f| f == finalizer)?;
    let path = format!("/metadata/finalizers/{idx}");
    Some(
        serde_json::from_value(json!([
            {"op": "test", "path": path, "value": finalizer},
            {"op": "remove", "path": path},
        ]))
        .expect("a well-formed JSON patch"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn adding_appends_once_to_the_object_as_read() {
        let p = add_patch(&[], Some("7"), "a/b").unwrap();
        assert_eq!(
            serde_json::to_value(p).unwrap(),
            json!([
                {"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
                {"op": "add", "path": "/metadata/finalizers", "value": ["a/b"]},
            ])
        );
        let p = add_patch(&list(&["x"]), Some("8"), "a/b").unwrap();
        assert_eq!(
            serde_json::to_value(p).unwrap()[1],
            json!({"op": "add", "path": "/metadata/finalizers/-", "value": "a/b"})
        );
        assert!(add_patch(&list(&["x", "a/b"]), Some("8"), "a/b").is_none());
    }

    #[test]
    fn removing_tests_the_index_it_read() {
        let p = remove_patch(&list(&["x", "a/b"]), "a/b").unwrap();
        assert_eq!(
            serde_json::to_value(p).unwrap(),
            json!([
                {"op": "test", "path": "/metadata/finalizers/1", "value": "a/b"},
                {"op": "remove", "path": "/metadata/finalizers/1"},
            ])
        );
        assert!(remove_patch(&list(&["x"]), "a/b").is_none());
        // Applied to a list that changed meanwhile, the test fails.
        let mut doc = json!({"metadata": {"finalizers": ["a/b"]}});
        let stale = remove_patch(&list(&["x", "a/b"]), "a/b").unwrap();
        assert!(json_patch::patch(&mut doc, &stale).is_err());
        let fresh = remove_patch(&list(&["a/b"]), "a/b").unwrap();
        json_patch::patch(&mut doc, &fresh).unwrap();
        assert_eq!(doc, json!({"metadata": {"finalizers": []}}));
    }
}
