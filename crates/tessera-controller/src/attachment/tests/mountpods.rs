//! MountPod specs: the desired spec, what counts as a change, the
//! apply body.

use super::*;

#[test]
fn a_single_writer_volume_with_fenced_failover_gets_a_self_fencing_daemon() {
    use tessera_api::NodeFailover::{Fenced, Off};
    for (mode, failover, want) in [
        (AccessMode::ReadWriteOnce, Some(Fenced), true),
        (AccessMode::ReadWriteOncePod, Some(Fenced), true),
        (AccessMode::ReadWriteOnce, Some(Off), false),
        (AccessMode::ReadWriteOnce, None, false),
        (AccessMode::ReadWriteMany, Some(Fenced), false),
    ] {
        let mut v = volume(mode);
        v.spec.node_failover = failover;
        let spec = desired_spec(&v, "n1", false, MountTask::Serve).unwrap();
        assert_eq!(spec.self_fence, want, "{mode:?} {failover:?}");
        let body = apply_body(&v, &Labels::default(), &spec);
        assert_eq!(body["spec"].get("selfFence").is_some(), want, "{body}");
    }
}

#[test]
fn desired_spec_from_the_volume() {
    let v = volume(AccessMode::ReadWriteOnce);
    let spec = desired_spec(&v, "n1", true, MountTask::RemoveData).unwrap();
    assert_eq!(
        spec,
        MountPodSpec {
            populate_from: None,
            volume: "v".into(),
            node_name: "n1".into(),
            source: "/b/v".into(),
            task: MountTask::RemoveData,
            capacity_bytes: 1 << 30,
            read_only: true,
            shared_backend: true,
            shared_root_anchor: None,
            mount_options: vec!["allow_other".into()],
            references: vec![],
            retain_seconds: None,
            resources: None,
            attr_cache_seconds: None,
            self_fence: false,
        }
    );
    let mut local = v.clone();
    local.spec.backend.scope = api::BackendScope::NodeLocal;
    let spec = desired_spec(&local, "n1", false, MountTask::Serve).unwrap();
    assert!(!spec.shared_backend, "a NodeLocal backend is not shared");
    let mut bad = v.clone();
    bad.spec.size = Quantity("lots".into());
    let err = desired_spec(&bad, "n1", false, MountTask::Serve).unwrap_err();
    assert!(err.to_string().starts_with("volume v: "), "{err}");
    let mut huge = v;
    huge.spec.size = Quantity("8Ei".into());
    let err = desired_spec(&huge, "n1", false, MountTask::Serve).unwrap_err();
    assert_eq!(err.to_string(), "volume v: size too large");
    // Removing the data needs no size: a Volume with a size nothing can serve can
    // still be deleted.
    for bad in [&bad, &huge] {
        let spec = desired_spec(bad, "n1", false, MountTask::RemoveData).unwrap();
        assert_eq!((spec.task, spec.capacity_bytes), (MountTask::RemoveData, 0));
    }
}

#[test]
fn only_controlled_fields_count_as_a_change() {
    let v = volume(AccessMode::ReadWriteOnce);
    let base = desired_spec(&v, "n1", false, MountTask::Serve).unwrap();
    let changed = |f: fn(&mut MountPodSpec)| {
        let mut s = base.clone();
        f(&mut s);
        s
    };
    let cases: Vec<(&str, MountPodSpec, bool)> = vec![
        ("same", base.clone(), true),
        (
            "references (the CSI node's)",
            changed(|s| {
                s.references.push(api::MountReference {
                    target_path: "/k/p".into(),
                    owner: "pod/x".into(),
                    read_only: false,
                    pod: None,
                })
            }),
            true,
        ),
        (
            "retainSeconds",
            changed(|s| s.retain_seconds = Some(5)),
            true,
        ),
        ("source", changed(|s| s.source = "/c/v".into()), false),
        ("capacity", changed(|s| s.capacity_bytes += 1), false),
        ("read-only", changed(|s| s.read_only = true), false),
        (
            "shared backend",
            changed(|s| s.shared_backend = false),
            false,
        ),
        ("mount options", changed(|s| s.mount_options.clear()), false),
        ("task", changed(|s| s.task = MountTask::RemoveData), false),
    ];
    for (what, spec, same) in cases {
        assert_eq!(same_controlled_fields(&spec, &base), same, "{what}");
    }
}

#[test]
fn the_apply_body_holds_only_what_the_controller_owns() {
    let v = volume(AccessMode::ReadWriteOnce);
    let desired = desired_spec(&v, "n1", false, MountTask::Serve).unwrap();
    let watch = Labels([("tessera.io/test".to_string(), "t1".to_string())].into());
    let body = apply_body(&v, &watch, &desired);
    assert_eq!(body["metadata"]["name"], api::mountpod_name("v", "n1"));
    assert_eq!(
        body["metadata"]["labels"],
        serde_json::json!({
            "tessera.io/test": "t1",
            api::LABEL_NODE: "n1",
            api::LABEL_VOLUME: "v",
        })
    );
    let owner = &body["metadata"]["ownerReferences"][0];
    assert_eq!(
        (&owner["kind"], &owner["uid"], &owner["controller"]),
        (
            &serde_json::json!("Volume"),
            &serde_json::json!("uid-v"),
            &serde_json::json!(true)
        )
    );
    let spec = body["spec"].as_object().unwrap();
    assert!(
        !spec.contains_key("references"),
        "never the CSI node's field"
    );
    assert!(!spec.contains_key("retainSeconds"));
    assert_eq!(spec["source"], "/b/v");
    assert_eq!(spec["sharedBackend"], true);
    assert_eq!(spec["capacityBytes"], 1 << 30);
    assert_eq!(
        spec["task"],
        serde_json::to_value(MountTask::Serve).unwrap()
    );
}

#[test]
fn the_apply_body_carries_the_volumes_claim_and_no_other_annotation() {
    let mut v = volume(AccessMode::ReadWriteOnce);
    let desired = desired_spec(&v, "n1", false, MountTask::Serve).unwrap();
    let body = apply_body(&v, &Labels::default(), &desired);
    assert!(
        body["metadata"].get("annotations").is_none(),
        "no claim: none"
    );
    v.metadata.annotations = Some(
        [
            (api::ANNOTATION_PVC_NAME, "data"),
            (api::ANNOTATION_PVC_NAMESPACE, "db"),
            (api::ANNOTATION_CSI_NAME, "pvc-1"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
    );
    let body = apply_body(&v, &Labels::default(), &desired);
    assert_eq!(
        body["metadata"]["annotations"],
        serde_json::json!({
            api::ANNOTATION_PVC_NAME: "data",
            api::ANNOTATION_PVC_NAMESPACE: "db",
        })
    );
}

#[test]
fn a_created_mountpod_carries_the_agents_finalizer_only_where_an_agent_is_registered() {
    let v = volume(AccessMode::ReadWriteOnce);
    let desired = desired_spec(&v, "n1", false, MountTask::Serve).unwrap();
    let apply = apply_body(&v, &Labels::default(), &desired);
    // (agent registered on the node, finalizers of the created MountPod)
    let cases = [
        (true, serde_json::json!([api::MOUNT_FINALIZER])),
        (false, serde_json::Value::Null),
    ];
    for (agent, finalizers) in cases {
        let body = create_body(apply.clone(), agent);
        assert_eq!(body["metadata"]["finalizers"], finalizers, "agent {agent}");
        // Everything else is the apply body, and it parses as a MountPod.
        let mut rest = body.clone();
        rest["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("finalizers");
        assert_eq!(rest, apply, "agent {agent}");
        let mp: MountPod = serde_json::from_value(body).unwrap();
        assert_eq!(mp.spec, desired, "agent {agent}");
    }
}

#[test]
fn a_populate_spec_carries_the_data_source_until_the_volume_is_populated() {
    let mut v = volume(AccessMode::ReadWriteOnce);
    let from = api::DataSource {
        volume: "src".into(),
        source: "/b/src".into(),
    };
    // No data source: nothing to copy, and the agent refuses such a MountPod.
    let spec = desired_spec(&v, "n1", false, MountTask::Populate).unwrap();
    assert_eq!((spec.task, spec.populate_from), (MountTask::Populate, None));
    v.spec.data_source = Some(from.clone());
    let spec = desired_spec(&v, "n1", false, MountTask::Populate).unwrap();
    assert_eq!(spec.populate_from.as_ref(), Some(&from));
    // … and it is in what the controller applies.
    let body = apply_body(&v, &Labels::default(), &spec);
    assert_eq!(body["spec"]["populateFrom"]["volume"], "src");
    assert_eq!(body["spec"]["task"], "Populate");
    // Only a Populate task carries it.
    let spec = desired_spec(&v, "n1", false, MountTask::Serve).unwrap();
    assert_eq!(spec.populate_from, None);
    // Once populated, never again: a later restore ticket must not replace the data.
    v.metadata
        .annotations
        .get_or_insert_default()
        .insert(api::ANNOTATION_POPULATED.into(), "true".into());
    let spec = desired_spec(&v, "n1", false, MountTask::Populate).unwrap();
    assert_eq!(spec.populate_from, None);
}

#[test]
fn a_node_that_filled_the_volume_is_where_it_was_last_attached() {
    let v = volume(AccessMode::ReadWriteOnce);
    let mut filling = mountpod("n1", Some(MountPhase::Ready));
    filling.spec.task = MountTask::Populate;
    let s = super::super::status::volume_status(
        &v,
        &[std::sync::Arc::new(filling)],
        &decision(&["n1"], &[]),
        &t(100),
    );
    // Its data is there: a restore from it copies there, its cleanup removes it there.
    assert_eq!(s.last_attached_node.as_deref(), Some("n1"));
    // It serves no workload: not an attached node.
    assert!(s.attached_nodes.is_empty(), "{s:?}");
}
