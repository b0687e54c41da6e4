//! Issue 13: expired tickets and tickets for nodes that do not exist.

use super::*;

/// A ticket past its `expiresAt` is never honoured, from the first decision: not
/// chosen on a free volume, and not kept on a node that holds the volume for it.
#[test]
fn an_expired_ticket_is_never_honoured() {
    let mut expired = tk("manual-old", T::Manual, "n1");
    expired.ticket.expires_at = Some(time(-1));
    let free = input(RWO, vec![expired.clone()], &[]);
    let d = decide(&free);
    assert!(d.nodes.is_empty(), "an expired ticket attached: {d:#?}");
    assert_reason(
        &d,
        "manual-old",
        R::Expired,
        &["expired at", "no longer honoured"],
    );

    // Expiring exactly now is expired; a second later is not.
    let mut at_now = tk("manual-now", T::Manual, "n1");
    at_now.ticket.expires_at = Some(time(0));
    let mut later = tk("manual-later", T::Manual, "n2");
    later.ticket.expires_at = Some(time(1));
    let d = decide(&input(RWX, vec![at_now, later], &[("n2", ready())]));
    assert_reason(&d, "manual-now", R::Expired, &[]);
    assert_reason(&d, "manual-later", R::Attached, &[]);
    assert_eq!(nodes(&d), [("n2", false)]);

    // On the node that holds the volume for it: dropped, and a waiting ticket elsewhere
    // follows once the mount is gone. Even a workload ticket of a volume being deleted
    // does not keep its node once expired.
    let waiting = tk("csi-b", T::CsiAttacher, "n2");
    let held = input(
        RWO,
        vec![expired.clone(), waiting.clone()],
        &[("n1", ready())],
    );
    let d = decide(&held);
    assert!(d.nodes.is_empty(), "{d:#?}");
    assert_reason(&d, "manual-old", R::Expired, &[]);
    assert_reason(&d, "csi-b", R::WaitingForDetach, &["n1"]);
    let mut deleting = input(RWO, vec![expired], &[("n1", ready())]);
    deleting.deleting = true;
    let d = decide(&deleting);
    assert!(d.nodes.is_empty(), "{d:#?}");
    assert_reason(&d, "manual-old", R::Expired, &[]);
}

/// A ticket whose node does not exist is never honoured, whoever wrote it, and the
/// message does not claim the node ever existed.
#[test]
fn a_ticket_for_a_missing_node_is_not_honoured() {
    let mut i = input(
        RWO,
        vec![
            tk("manual-ghost", T::Manual, "ghost"),
            tk("csi-b", T::CsiAttacher, "n2"),
        ],
        &[("ghost", ready())],
    );
    i.missing_nodes = ["ghost".to_string()].into();
    let d = decide(&i);
    assert_reason(
        &d,
        "manual-ghost",
        R::NodeNotFound,
        &["node ghost does not exist"],
    );
    assert!(!outcome(&d, "manual-ghost").message.contains("no longer"));
    // It held the volume: the mount there is dropped, the other ticket waits for it.
    assert!(d.nodes.is_empty(), "{d:#?}");
    assert_reason(&d, "csi-b", R::WaitingForDetach, &["ghost"]);
    i.mounts.clear();
    let d = decide(&i);
    assert_eq!(nodes(&d), [("n2", false)]);
}

#[test]
fn the_next_expiry_is_the_earliest_one_still_ahead() {
    let with = |offsets: &[Option<i64>]| {
        let tickets = offsets
            .iter()
            .enumerate()
            .map(|(k, o)| {
                let mut t = tk(&format!("t{k}"), T::Manual, "n1");
                t.ticket.expires_at = o.map(time);
                t
            })
            .collect();
        input(RWX, tickets, &[])
    };
    let cases: [(&[Option<i64>], Option<i64>); 5] = [
        (&[], None),
        (&[None], None),
        (&[Some(-5), Some(0)], None),
        (&[Some(9), None, Some(-1), Some(3)], Some(3)),
        (&[Some(0), Some(1)], Some(1)),
    ];
    for (offsets, want) in cases {
        let i = with(offsets);
        assert_eq!(next_expiry(&i), want.map(time).as_ref(), "{offsets:?}");
    }
}
