//! Property tests over random worlds: the rules of one decision, order independence,
//! convergence, tickets that come and go.

use proptest::prelude::*;
use proptest::sample::select;

use super::*;

const NODES: [&str; 3] = ["node-a", "node-b", "node-c"];
const CASES: u32 = 4096;
/// The time of every random decision (seconds after [`time`]'s epoch).
const NOW: i64 = 2;

fn arb_state() -> impl Strategy<Value = MountState> {
    prop_oneof![
        Just(MountState::Starting),
        Just(MountState::Ready),
        Just(MountState::Failed("mount failed: boom".into())),
        Just(MountState::Terminating),
    ]
}

fn arb_read_only_param() -> impl Strategy<Value = Option<&'static str>> {
    prop_oneof![
        4 => Just(None),
        3 => Just(Some("true")),
        3 => Just(Some("false")),
        1 => Just(Some("yes")),
    ]
}

fn arb_ticket() -> impl Strategy<Value = TicketInput> {
    (
        // Random ids, so that id order is unrelated to anything else; duplicates are
        // removed in `arb_tickets`.
        "[a-h]",
        select(AttacherType::ALL.to_vec()),
        select(NODES.to_vec()),
        proptest::option::of(0i64..4),
        arb_read_only_param(),
        0i64..3,
        // Expiry before, at and after the decision's time, mostly none.
        proptest::option::weighted(0.3, NOW - 2..NOW + 3),
    )
        .prop_map(|(id, type_, node, at, ro, generation, expires)| {
            let mut t = tk(&format!("{}-{id}", type_.as_str()), type_, node).generation(generation);
            t.requested_at = at.map(time);
            t.ticket.expires_at = expires.map(time);
            match ro {
                Some(v) => t.param("readOnly", v),
                None => t,
            }
        })
}

fn arb_tickets() -> impl Strategy<Value = Vec<TicketInput>> {
    proptest::collection::vec(arb_ticket(), 0..=8).prop_map(|mut v| {
        let mut seen = BTreeSet::new();
        v.retain(|t| seen.insert(t.ticket.id.clone()));
        v
    })
}

fn arb_mounts() -> impl Strategy<Value = BTreeMap<String, MountView>> {
    proptest::collection::vec(
        proptest::option::of((arb_state(), any::<bool>(), proptest::bool::weighted(0.2))),
        NODES.len(),
    )
    .prop_map(|v| {
        NODES
            .iter()
            .zip(v)
            .filter_map(|(n, m)| {
                m.map(|(state, read_only, removes_data)| {
                    let m = MountView {
                        removes_data,
                        ..mount(state, read_only)
                    };
                    (n.to_string(), m)
                })
            })
            .collect()
    })
}

fn arb_input() -> impl Strategy<Value = Input> {
    (
        select(vec![RWO, RWOP, ROX, RWX]),
        proptest::bool::weighted(0.25),
        proptest::option::weighted(0.2, select(NODES.to_vec())),
        arb_tickets(),
        arb_mounts(),
        proptest::option::weighted(0.2, select(NODES.to_vec())),
    )
        .prop_map(
            |(access_mode, deleting, pinned, tickets, mounts, missing)| Input {
                access_mode,
                deleting,
                pinned_node: pinned.map(str::to_string),
                tickets,
                mounts,
                now: time(NOW),
                missing_nodes: missing.map(str::to_string).into_iter().collect(),
            },
        )
}

/// The spec of eligibility, restated independently of the implementation.
fn eligible(i: &Input, t: &TicketInput) -> bool {
    let ticket = &t.ticket;
    let current = ticket.expires_at.as_ref().is_none_or(|e| e.0 > i.now.0)
        && !i.missing_nodes.contains(&ticket.node_id);
    let valid = matches!(
        ticket.parameters.get("readOnly").map(String::as_str),
        None | Some("true" | "false")
    );
    let on_pinned = i.pinned_node.as_ref().is_none_or(|p| *p == ticket.node_id);
    let not_deleting = !i.deleting
        || ticket.type_ == T::Cleanup
        || (!is_background(ticket.type_)
            && holders(i).contains(ticket.node_id.as_str())
            && !i.mounts[&ticket.node_id].removes_data);
    current && valid && on_pinned && not_deleting
}

/// The order of the rules, restated independently of [`ticket_order`]: priority
/// descending, then `requested_at` ascending with unknown last, then id.
fn spec_order(a: &TicketInput, b: &TicketInput) -> std::cmp::Ordering {
    let prio = priority(b.ticket.type_).cmp(&priority(a.ticket.type_));
    let at = match (&a.requested_at, &b.requested_at) {
        (Some(x), Some(y)) => x.0.cmp(&y.0),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => std::cmp::Ordering::Equal,
    };
    prio.then(at).then_with(|| a.ticket.id.cmp(&b.ticket.id))
}

/// Properties of one decision (1, 3, 4 and 6 of the brief).
fn check_decision(i: &Input, d: &Decision) -> Result<(), TestCaseError> {
    let held = holders(i);

    // 4: every ticket has an outcome; messages; satisfied ⇔ Attached; generation.
    let ids: BTreeSet<&str> = i.tickets.iter().map(|t| t.ticket.id.as_str()).collect();
    prop_assert_eq!(
        d.tickets
            .keys()
            .map(String::as_str)
            .collect::<BTreeSet<_>>(),
        ids
    );
    for t in &i.tickets {
        let o = &d.tickets[&t.ticket.id];
        prop_assert!(!o.message.is_empty());
        prop_assert_eq!(o.satisfied, o.reason == R::Attached, "{:?}", o);
        prop_assert_eq!(o.generation, t.ticket.generation);
        if o.satisfied {
            // Satisfied means proven: chosen, Ready, compatible.
            let node = &t.ticket.node_id;
            let m = i.mounts.get(node);
            prop_assert!(d.nodes.contains_key(node));
            prop_assert_eq!(m.map(|m| &m.state), Some(&MountState::Ready));
            let m = m.unwrap();
            let ticket_ro = t.ticket.parameters.get("readOnly").map(String::as_str) == Some("true");
            // A restore ticket is satisfied by a mount that filled the volume (read-write
            // whatever the mode); every other one by a serving mount of its mode.
            prop_assert_eq!(m.populates, t.ticket.type_ == T::VolumeRestore);
            match i.access_mode {
                _ if m.populates => prop_assert!(!m.read_only),
                ROX => prop_assert!(m.read_only),
                _ => prop_assert!(ticket_ro || !m.read_only),
            }
        }
        if !eligible(i, t) {
            prop_assert!(
                matches!(
                    o.reason,
                    R::Expired
                        | R::NodeNotFound
                        | R::InvalidParameters
                        | R::NodeLocalElsewhere
                        | R::VolumeDeleting
                ),
                "{:?}",
                o
            );
        }
    }

    // Every chosen node is wanted by an eligible ticket, with the right mode.
    for (node, nm) in &d.nodes {
        let on_node: Vec<&TicketInput> = i
            .tickets
            .iter()
            .filter(|t| t.ticket.node_id == *node && eligible(i, t))
            .collect();
        prop_assert!(
            !on_node.is_empty(),
            "{} chosen without an eligible ticket",
            node
        );
        let all_ro = on_node
            .iter()
            .all(|t| t.ticket.parameters.get("readOnly").map(String::as_str) == Some("true"));
        // A node that fills the volume from its data source mounts it read-write.
        let all_restore = on_node.iter().all(|t| t.ticket.type_ == T::VolumeRestore);
        prop_assert_eq!(
            nm.read_only,
            (i.access_mode == ROX || all_ro) && !all_restore
        );
        prop_assert_eq!(nm.populates, all_restore && !nm.removes_data);
    }

    if i.access_mode.is_multi_node() {
        // Every eligible ticket's node is chosen.
        for t in i.tickets.iter().filter(|t| eligible(i, t)) {
            prop_assert!(d.nodes.contains_key(&t.ticket.node_id));
        }
    } else {
        // 1: one node at most, and never a new one while any MountPod exists.
        prop_assert!(d.nodes.len() <= 1);
        if let Some(node) = d.nodes.keys().next() {
            prop_assert!(
                held.contains(node.as_str()) || i.mounts.is_empty(),
                "attached {} beside {:?}",
                node,
                i.mounts
            );
        }
        // 3: no preemption. The holder of the first eligible workload ticket on any
        // holder stays (there is only one such holder unless the world is inconsistent).
        let mut by_order: Vec<&TicketInput> = i.tickets.iter().collect();
        by_order.sort_by(|a, b| spec_order(a, b));
        let first_held_workload = by_order.iter().find(|t| {
            !is_background(t.ticket.type_)
                && held.contains(t.ticket.node_id.as_str())
                && eligible(i, t)
        });
        if let Some(w) = first_held_workload {
            prop_assert_eq!(d.nodes.keys().collect::<Vec<_>>(), [&w.ticket.node_id]);
        }
        // Background holders yield only to a workload.
        let any_workload = i
            .tickets
            .iter()
            .any(|t| !is_background(t.ticket.type_) && eligible(i, t));
        if !any_workload && d.nodes.is_empty() {
            prop_assert!(
                !i.tickets
                    .iter()
                    .any(|t| eligible(i, t) && held.contains(t.ticket.node_id.as_str()))
            );
        }
        // On a free volume the first eligible ticket in order wins.
        if i.mounts.is_empty() {
            let first = by_order.iter().find(|t| eligible(i, t));
            prop_assert_eq!(d.nodes.keys().next(), first.map(|t| &t.ticket.node_id));
        }
        // ... and do yield: with a workload waiting and none held, no holder is kept.
        if any_workload && first_held_workload.is_none() {
            prop_assert!(
                d.nodes.keys().all(|n| !held.contains(n.as_str())),
                "{:?} kept",
                d.nodes
            );
        }
        for o in d.tickets.values() {
            if o.reason == R::Interrupted {
                prop_assert!(any_workload);
            }
        }
    }

    // 6: pinned and deleting.
    if let Some(p) = &i.pinned_node {
        prop_assert!(d.nodes.keys().all(|n| n == p));
    }
    if i.deleting {
        // Each chosen node has an eligible cleanup ticket, or held the volume for an
        // eligible workload ticket: deleting starts no attachment for anything else.
        for node in d.nodes.keys() {
            let cleanup = i.tickets.iter().any(|t| {
                t.ticket.node_id == *node && t.ticket.type_ == T::Cleanup && eligible(i, t)
            });
            let kept = held.contains(node.as_str())
                && i.tickets.iter().any(|t| {
                    t.ticket.node_id == *node && !is_background(t.ticket.type_) && eligible(i, t)
                });
            prop_assert!(cleanup || kept, "{} chosen while deleting", node);
        }
        for t in &i.tickets {
            if is_background(t.ticket.type_) && t.ticket.type_ != T::Cleanup {
                prop_assert!(!d.tickets[&t.ticket.id].satisfied);
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    /// Properties 1, 3, 4 and 6 on random worlds.
    #[test]
    fn prop_decision_rules(i in arb_input()) {
        let d = decide(&i);
        check_decision(&i, &d)?;
    }

    /// Property 2 and determinism: shuffling (or reversing) the tickets changes nothing.
    #[test]
    fn prop_order_does_not_matter(
        (i, shuffled) in arb_input().prop_flat_map(|i| {
            let tickets = i.tickets.clone();
            (Just(i), Just(tickets).prop_shuffle())
        })
    ) {
        let d = decide(&i);
        prop_assert_eq!(&d, &decide(&i));
        let mut other = i.clone();
        other.tickets = shuffled;
        prop_assert_eq!(&d, &decide(&other));
        other.tickets.reverse();
        prop_assert_eq!(&d, &decide(&other));
    }

    /// Property 5: following the decisions converges to a fixpoint where the decision
    /// is stable and every eligible ticket on a chosen node is satisfied.
    #[test]
    fn prop_converges(i in arb_input()) {
        let single = !i.access_mode.is_multi_node();
        let initially_consistent = holders(&i).len() <= 1;
        let trace = converge(i, 8);
        for (k, (w, d)) in trace.iter().enumerate() {
            check_decision(w, d)?;
            if single && initially_consistent {
                // Never two writers, in any round.
                prop_assert!(holders(w).len() <= 1, "round {}: {:?}", k, w.mounts);
            }
            if k > 0 {
                // A MountPod appears only where the previous decision asked for one.
                let (prev, prev_d) = &trace[k - 1];
                for node in w.mounts.keys() {
                    prop_assert!(prev.mounts.contains_key(node) || prev_d.nodes.contains_key(node));
                }
            }
        }
        let (w, d) = trace.last().unwrap();
        // Stable: the world matches the decision, and deciding again changes nothing.
        prop_assert_eq!(&actuate(&w.mounts, d), &w.mounts);
        prop_assert_eq!(&decide(w), d);
        prop_assert_eq!(w.mounts.keys().collect::<Vec<_>>(), d.nodes.keys().collect::<Vec<_>>());
        for (node, m) in &w.mounts {
            prop_assert_eq!(&m.state, &MountState::Ready);
            prop_assert_eq!(m.read_only, d.nodes[node].read_only);
        }
        for t in &w.tickets {
            // A cleanup ticket on a node that serves other tickets waits for them.
            // So does a restore ticket on a node that serves other tickets.
            let in_use = (t.ticket.type_ == T::Cleanup
                && d.nodes.get(&t.ticket.node_id).is_some_and(|n| !n.removes_data))
                || (t.ticket.type_ == T::VolumeRestore
                    && d.nodes.get(&t.ticket.node_id).is_some_and(|n| !n.populates));
            if eligible(w, t) && d.nodes.contains_key(&t.ticket.node_id) {
                if in_use {
                    prop_assert_eq!(d.tickets[&t.ticket.id].reason, R::InUse);
                } else {
                    prop_assert!(d.tickets[&t.ticket.id].satisfied, "{:?}", d.tickets[&t.ticket.id]);
                }
            }
        }
        // Liveness: an eligible ticket means the volume is attached somewhere.
        if w.tickets.iter().any(|t| eligible(w, t)) {
            prop_assert!(!d.nodes.is_empty());
        }
        if single {
            // Everything eligible elsewhere waits for the holder.
            let waiting = w
                .tickets
                .iter()
                .filter(|t| eligible(w, t) && !d.nodes.contains_key(&t.ticket.node_id));
            for t in waiting {
                prop_assert_eq!(d.tickets[&t.ticket.id].reason, R::HeldByOtherNode);
            }
        }
    }

    /// Tickets come and go between rounds: a single-node volume never has two holders,
    /// and a holder with a workload ticket that stays is never detached.
    #[test]
    fn prop_tickets_come_and_go(
        mode in select(vec![RWO, RWOP]),
        ops in proptest::collection::vec(
            prop_oneof![2 => arb_ticket().prop_map(Some), 1 => Just(None)],
            0..24,
        ),
        removals in proptest::collection::vec(any::<prop::sample::Index>(), 24),
    ) {
        let mut world = input(mode, vec![], &[]);
        for (k, op) in ops.into_iter().enumerate() {
            match op {
                Some(t) => {
                    world.tickets.retain(|x| x.ticket.id != t.ticket.id);
                    world.tickets.push(t);
                }
                None if !world.tickets.is_empty() => {
                    let at = removals[k].index(world.tickets.len());
                    world.tickets.remove(at);
                }
                None => {}
            }
            let d = decide(&world);
            check_decision(&world, &d)?;
            let next = actuate(&world.mounts, &d);
            // A holder with an eligible workload ticket keeps its mount.
            for node in holders(&world) {
                let workload = world.tickets.iter().any(|t| {
                    t.ticket.node_id == node
                        && !is_background(t.ticket.type_)
                        && t.ticket.type_ != T::VolumeRestore
                        && eligible(&world, t)
                });
                // (A mount that removed the data, or filled the volume, is replaced by
                // a serving one.)
                let m = &world.mounts[node];
                if workload && !m.removes_data && !m.populates {
                    prop_assert!(holders_of(&next).contains(node));
                }
            }
            world.mounts = next;
            prop_assert!(holders(&world).len() <= 1, "{:?}", world.mounts);
        }
    }
}
