//! GitOps health of objects, as the tools themselves compute it: kstatus (Flux,
//! cli-utils, `kpt live status`) by cli-utils' own `status.Compute` in the harness
//! binary `kstatus` (tests/harness/kstatus/), and Argo CD by the health script Tessera
//! ships (config/argocd/health.lua), run in an embedded Lua 5.1 (the dialect of Argo
//! CD's gopher-lua) with the object as the global `obj`, as Argo CD runs it.

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};

use mlua::serde::SerializeOptions;
use mlua::{Lua, LuaSerdeExt};
use serde_json::{Value, json};

/// kstatus's status (Current, InProgress, Failed, Terminating, …) of each object, by
/// `<kind>/<name>`: the objects are given to the harness binary as one List.
pub fn kstatus(objects: &[Value]) -> BTreeMap<String, String> {
    let bin = super::repo_root().join("target/harness/bin/kstatus");
    assert!(
        bin.exists(),
        "{} is missing: build the harness (`make harness`)",
        bin.display()
    );
    let mut child = Command::new(&bin)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("running {}: {e}", bin.display()));
    let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
    child
        .stdin
        .take()
        .unwrap()
        .write_all(list.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "kstatus: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|line| {
            let mut f = line.splitn(3, '\t');
            let (object, status) = (f.next().unwrap(), f.next().expect("a status"));
            (object.to_string(), status.to_string())
        })
        .collect()
}

/// The shipped Argo CD health script.
pub fn argocd_script() -> String {
    let path = super::repo_root().join("config/argocd/health.lua");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Argo CD's health of `obj` by `script`: (status, message).
pub fn argocd_health(script: &str, obj: &Value) -> (String, String) {
    let lua = Lua::new();
    // JSON null is nil in Lua, as Argo CD converts objects.
    let options = SerializeOptions::new()
        .serialize_none_to_null(false)
        .serialize_unit_to_null(false);
    let value = lua.to_value_with(obj, options).unwrap();
    lua.globals().set("obj", value).unwrap();
    let hs: mlua::Table = lua
        .load(script)
        .set_name("health.lua")
        .eval()
        .unwrap_or_else(|e| panic!("health.lua on {obj}: {e}"));
    let status: String = hs.get("status").expect("hs.status");
    let message: Option<String> = hs.get("message").unwrap();
    (status, message.unwrap_or_default())
}
