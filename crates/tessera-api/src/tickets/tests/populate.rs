//! `volume-restore` tickets: the node fills the volume from its data source.

use super::*;

fn populating() -> MountView {
    MountView {
        populates: true,
        ..ready()
    }
}

#[test]
fn a_restore_ticket_alone_gets_a_mount_that_fills_the_volume() {
    let i = input(RWO, vec![tk("restore-s", T::VolumeRestore, "node-a")], &[]);
    let d = decide(&i);
    let m = d.nodes["node-a"];
    assert!(m.populates && !m.removes_data && !m.read_only, "{m:?}");
    assert_reason(&d, "restore-s", R::Attaching, &["node-a"]);

    // Only a Ready mount that populated satisfies it.
    let i = input(
        RWO,
        vec![tk("restore-s", T::VolumeRestore, "node-a")],
        &[("node-a", populating())],
    );
    assert_reason(&decide(&i), "restore-s", R::Attached, &[]);
    let i = input(
        RWO,
        vec![tk("restore-s", T::VolumeRestore, "node-a")],
        &[("node-a", ready())],
    );
    assert_reason(
        &decide(&i),
        "restore-s",
        R::GenerationPending,
        &["fills it"],
    );
}

#[test]
fn a_populating_mount_never_serves_a_workload_and_a_served_volume_is_never_filled() {
    // A workload is not satisfied by a mount that fills the volume.
    let i = input(
        RWO,
        vec![tk("csi-a", T::CsiAttacher, "node-a")],
        &[("node-a", populating())],
    );
    let d = decide(&i);
    assert!(!d.nodes["node-a"].populates);
    assert_reason(&d, "csi-a", R::GenerationPending, &["fills the volume"]);

    // A restore ticket on a node that serves a workload waits for it (InUse): the
    // node's mount stays a serving one.
    let i = input(
        RWO,
        vec![
            tk("csi-a", T::CsiAttacher, "node-a"),
            tk("restore-s", T::VolumeRestore, "node-a"),
        ],
        &[("node-a", ready())],
    );
    let d = decide(&i);
    assert!(!d.nodes["node-a"].populates);
    assert_reason(&d, "csi-a", R::Attached, &[]);
    assert_reason(&d, "restore-s", R::InUse, &["csi-a (csi-attacher)"]);
}

#[test]
fn a_restore_is_never_interrupted_by_a_workload_elsewhere() {
    // Restore tickets are system work: a workload on another node waits.
    let i = input(
        RWO,
        vec![
            tk("restore-s", T::VolumeRestore, "node-a").at(0),
            tk("csi-b", T::CsiAttacher, "node-b").at(1),
        ],
        &[("node-a", populating())],
    );
    let d = decide(&i);
    assert_eq!(nodes(&d), [("node-a", false)]);
    assert_reason(&d, "restore-s", R::Attached, &[]);
    assert_reason(&d, "csi-b", R::HeldByOtherNode, &["node-a"]);
}

#[test]
fn converging_from_a_served_volume_to_a_restore_replaces_the_mount() {
    let world = input(
        RWO,
        vec![tk("restore-s", T::VolumeRestore, "node-a")],
        &[("node-a", ready())],
    );
    let rounds = converge(world, 6);
    let (last_input, last) = rounds.last().unwrap();
    assert_reason(last, "restore-s", R::Attached, &[]);
    assert!(last_input.mounts["node-a"].populates);
}
