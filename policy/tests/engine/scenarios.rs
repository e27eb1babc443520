//! Multi-step scenarios: exact entries, label changes, selective regeneration, diffs, trace.

use crate::world::World;
use std::collections::BTreeSet;
use weft_policy::diff::plan;
use weft_policy::identity::IdentityKey;
use weft_policy::labels::{Label, LabelSet};
use weft_policy::mapstate::Direction::{Egress, Ingress};
use weft_policy::mapstate::proto::{ANY, SCTP, TCP, UDP};
use weft_policy::mapstate::{EndpointPolicy, PolicyEntry, Verdict, reserved};
use weft_policy::trace::Decision;

const L3_L4: &str = r#"[{"labels":[{"key":"name","value":"l3-rule"}],
  "endpointSelector":{"matchLabels":{"app":"web"}},
  "ingress":[{"fromEndpoints":[{"matchLabels":{"app":"client"}}],
              "toPorts":[{"ports":[{"port":"80","protocol":"TCP"}]}]}]}]"#;

#[test]
fn exact_entries_of_the_getting_started_policy() {
    let mut w = World::new();
    w.import(L3_L4);
    let client = w.eps["client"].0;
    // A plain Cilium rule is not namespaced: app=client in every namespace.
    let prod_client = w.eps["prod-client"].0;
    let p = w.policy("web");
    assert!(p.ingress_enforced && !p.egress_enforced);
    let want: Vec<(PolicyEntry, Verdict)> = vec![
        (
            PolicyEntry::new(Ingress, reserved::HOST, ANY, 0, u16::MAX),
            Verdict::Allow,
        ),
        (
            PolicyEntry::new(Ingress, client, TCP, 80, 80),
            Verdict::Allow,
        ),
        (
            PolicyEntry::new(Ingress, prod_client, TCP, 80, 80),
            Verdict::Allow,
        ),
    ];
    assert_eq!(p.entries.into_iter().collect::<Vec<_>>(), want);
    assert_eq!(w.policy("db"), EndpointPolicy::default());
    w.opts.allow_from_host = false;
    assert_eq!(w.policy("web").entries.len(), 2);
}

#[test]
fn any_protocol_with_port_never_uses_proto_zero() {
    let mut w = World::new();
    w.import(r#"[{"endpointSelector":{},"egress":[{"toEntities":["all"],"toPorts":[{"ports":[{"port":"53"}]}]}]}]"#);
    let p = w.policy("web");
    let protos: BTreeSet<u8> = p
        .entries
        .keys()
        .filter(|k| k.direction == Egress)
        .map(|k| k.proto)
        .collect();
    assert_eq!(protos, BTreeSet::from([TCP, UDP, SCTP]));
    assert!(p.entries.keys().all(|k| k.proto != ANY || k.all_ports()));
}

#[test]
fn broad_deny_is_emitted_at_the_allows_key() {
    let mut w = World::new();
    w.import(
        r#"[{"endpointSelector":{"matchLabels":{"app":"web"}},
        "ingress":[{"fromEndpoints":[{"matchLabels":{"app":"client"}}],"toPorts":[{"ports":[{"port":"80","protocol":"TCP"}]}]}],
        "ingressDeny":[{"fromEntities":["all"],"toPorts":[{"ports":[{"port":"80","endPort":81,"protocol":"TCP"}]}]}]}]"#,
    );
    let client = w.eps["client"].0;
    let p = w.policy("web");
    assert_eq!(
        p.entries
            .get(&PolicyEntry::new(Ingress, client, TCP, 80, 80)),
        Some(&Verdict::Deny)
    );
    assert_eq!(
        p.entries.get(&PolicyEntry::new(Ingress, 0, TCP, 80, 81)),
        Some(&Verdict::Deny)
    );
    // The host allow-all overlaps the any-identity deny: carved at the host's identity.
    assert_eq!(
        p.entries
            .get(&PolicyEntry::new(Ingress, reserved::HOST, TCP, 80, 81)),
        Some(&Verdict::Deny)
    );
    assert!(p.deny_shadowing_violations().is_empty());
}

/// An allow of the deny's first port from every peer, beside the host's allow-all: the any-identity
/// allow becomes a deny of that port, and the host's allow is carved over the whole denied range
/// (one wider deny at the host's identity, not one per any-identity deny). Found by the
/// structured property test, whose check asked for the exact key of each overlap.
#[test]
fn a_wider_deny_at_the_hosts_identity_covers_each_overlap() {
    let mut w = World::new();
    w.import(
        r#"[{"endpointSelector":{"matchLabels":{"app":"web"}},
        "ingressDeny":[{"toPorts":[{"ports":[{"port":"639","endPort":734,"protocol":"TCP"}]}]}]},
        {"endpointSelector":{"matchLabels":{"k8s:io.kubernetes.pod.namespace":"default"}},
        "ingress":[{"toPorts":[{"ports":[{"port":"639","protocol":"TCP"}]}]}]}]"#,
    );
    let p = w.policy("web");
    assert_eq!(
        p.entries
            .get(&PolicyEntry::new(Ingress, reserved::HOST, TCP, 639, 734)),
        Some(&Verdict::Deny)
    );
    for (port, want) in [
        (638, Verdict::Allow),
        (639, Verdict::Deny),
        (700, Verdict::Deny),
        (734, Verdict::Deny),
        (735, Verdict::Allow),
    ] {
        assert_eq!(
            p.lookup(Ingress, reserved::HOST, TCP, port),
            want,
            "host to {port}"
        );
    }
    assert!(p.deny_shadowing_violations().is_empty());
}

#[test]
fn shadowing_check_catches_a_missing_carve() {
    let mut p = EndpointPolicy {
        ingress_enforced: true,
        ..EndpointPolicy::default()
    };
    p.entries
        .insert(PolicyEntry::new(Ingress, 300, TCP, 80, 80), Verdict::Allow);
    p.entries.insert(
        PolicyEntry::new(Ingress, 300, ANY, 0, u16::MAX),
        Verdict::Deny,
    );
    assert_eq!(p.deny_shadowing_violations().len(), 1);
    // A deny at the allow's identity that covers the overlap but is less specific than the
    // allow (any protocol against TCP, or the same protocol over wider ports) is not found
    // by the lookup before the allow: still a violation.
    p.entries.insert(
        PolicyEntry::new(Ingress, 300, TCP, 0, u16::MAX),
        Verdict::Deny,
    );
    assert_eq!(p.deny_shadowing_violations().len(), 2);
    p.entries
        .insert(PolicyEntry::new(Ingress, 300, TCP, 80, 80), Verdict::Deny);
    assert!(p.deny_shadowing_violations().is_empty());
}

#[test]
fn peer_label_change_moves_identity_out_of_selector() {
    let mut w = World::new();
    w.import(L3_L4);
    let old_id = w.eps["client"].0;
    let before = w.policy("web");
    assert_eq!(before.lookup(Ingress, old_id, TCP, 80), Verdict::Allow);

    // weftctl endpoint labels client --remove app --add app=other
    let (_, mut labels) = w.eps["client"].clone();
    labels.insert(Label::new("k8s", "app", "other"));
    w.remove_endpoint("client");
    let released_changes = w.cache.identities(&peer_client(&w)).contains(&old_id);
    assert!(!released_changes, "released identity left the selector");
    w.add_endpoint("client", labels);
    let new_id = w.eps["client"].0;
    assert_ne!(new_id, old_id);
    let after = w.policy("web");
    assert_eq!(after.lookup(Ingress, new_id, TCP, 80), Verdict::Deny);
    assert!(!after.entries.keys().any(|k| k.identity == old_id));

    // And back in: a new identity for app=client is added to the selector.
    let changed = w.cache.identity_added(
        9999,
        &IdentityKey::Labels(LabelSet::for_pod("default", [("app", "client")])),
    );
    assert!(changed.contains(&peer_client(&w)));
    assert!(
        w.repo.endpoint_uses(&w.eps["web"].1, &changed),
        "web must be regenerated"
    );
    assert!(
        !w.repo.endpoint_uses(&w.eps["db"].1, &changed),
        "db need not be"
    );
    assert_eq!(
        w.policy("web").lookup(Ingress, 9999, TCP, 80),
        Verdict::Allow
    );
}

fn peer_client(w: &World) -> weft_policy::rule::PeerSelector {
    w.repo.rules()[0].ingress[0].peers[0].clone()
}

#[test]
fn subject_label_change_moves_endpoint_out_of_rule() {
    let mut w = World::new();
    w.import(L3_L4);
    assert!(w.policy("web").ingress_enforced);
    w.remove_endpoint("web");
    w.add_endpoint("web", LabelSet::for_pod("default", [("app", "web2")]));
    assert_eq!(w.policy("web"), EndpointPolicy::default());
}

#[test]
fn selective_regeneration_after_import() {
    let mut w = World::new();
    w.import(L3_L4);
    let rules = weft_policy::parse::parse_policy_file(
        "x",
        r#"[{"labels":["name=db"],"endpointSelector":{"matchLabels":{"tier":"backend"}},"egress":[{}]}]"#,
    )
    .unwrap();
    let change = w.repo.add(rules);
    let regen: Vec<&str> = w
        .eps
        .iter()
        .filter(|(_, (_, l))| change.selects(l))
        .map(|(n, _)| n.as_str())
        .collect();
    assert_eq!(regen, ["db"]);
    assert_eq!(change.revision, 3);
}

#[test]
fn cidr_identities_follow_the_repository() {
    let mut w = World::new();
    w.import(r#"[{"labels":["name=c"],"endpointSelector":{},"egress":[{"toCIDRSet":[{"cidr":"10.0.0.0/8","except":["10.96.0.0/12"]}]}]}]"#);
    assert_eq!(w.alloc.cidr_identities().count(), 2);
    let change = w.repo.delete(&[Label::parse_filter("name=c").unwrap()]);
    assert_eq!(change.removed.len(), 1);
    // The manager releases identities of prefixes no longer in use.
    let sync = w.sync_cidrs();
    assert_eq!(sync.released.len(), 2);
    assert!(sync.added.is_empty());
    assert_eq!(w.alloc.cidr_identities().count(), 0);
    w.cache.sync(&w.repo);
    assert_eq!(w.cache.selectors().count(), 0);
    assert_eq!(w.policy("web"), EndpointPolicy::default());
}

#[test]
fn trace_names_the_deciding_rule() {
    let mut w = World::new();
    w.import(L3_L4);
    w.import(r#"[{"labels":["name=no-db"],"endpointSelector":{"matchLabels":{"app":"web"}},"ingressDeny":[{"fromEndpoints":[{"matchLabels":{"app":"db"}}]}]}]"#);
    let t = w.trace_dir("web", Ingress, "ep:client", TCP, 80);
    let d = t.ingress.unwrap().decision;
    assert!(
        matches!(&d, Decision::AllowedBy(l) if l.to_string() == "unspec:name=l3-rule"),
        "{d}"
    );
    let t = w.trace_dir("web", Ingress, "ep:db", TCP, 80);
    assert_eq!(
        t.ingress.unwrap().decision.to_string(),
        "denied by rule [unspec:name=no-db]"
    );
    let t = w.trace_dir("web", Ingress, "ep:client", TCP, 81);
    assert_eq!(t.ingress.unwrap().decision, Decision::DefaultDeny);
    let t = w.trace_dir("db", Ingress, "ep:client", TCP, 81);
    assert_eq!(
        t.ingress.unwrap().decision.to_string(),
        "not selected (default allow)"
    );
    assert_eq!(t.egress, None, "the peer is not a local endpoint here");
}

/// Applies a diff one operation at a time and checks every intermediate state.
fn assert_no_transient_drop(w: &World, old: &EndpointPolicy, new: &EndpointPolicy) {
    let probes: Vec<(weft_policy::mapstate::Direction, u32, u8, u16)> = {
        let mut ids: BTreeSet<u32> = w.eps.values().map(|(id, _)| *id).collect();
        ids.extend([reserved::HOST, reserved::WORLD]);
        let mut v = Vec::new();
        for dir in [Ingress, Egress] {
            for &id in &ids {
                for (proto, port) in [(TCP, 80), (TCP, 443), (UDP, 53), (TCP, 5432)] {
                    v.push((dir, id, proto, port));
                }
            }
        }
        v
    };
    let d = plan(old, new);
    let mut state = old.clone();
    let check = |s: &EndpointPolicy, step: &str| {
        for &(dir, id, proto, port) in &probes {
            let both = old.lookup(dir, id, proto, port) == Verdict::Allow
                && new.lookup(dir, id, proto, port) == Verdict::Allow;
            assert!(
                !both || s.lookup(dir, id, proto, port) == Verdict::Allow,
                "{step}: dropped {dir:?} {id} {proto}/{port}"
            );
            let never = old.lookup(dir, id, proto, port) == Verdict::Deny
                && new.lookup(dir, id, proto, port) == Verdict::Deny;
            assert!(
                !never || s.lookup(dir, id, proto, port) == Verdict::Deny,
                "{step}: let through {dir:?} {id} {proto}/{port}"
            );
        }
    };
    state.apply_stepwise(&d, check);
    assert_eq!(&state, new);
    let mut applied = old.clone();
    applied.apply(&d);
    assert_eq!(&applied, new);
    assert!(plan(new, new).is_empty());
}

#[test]
fn diff_transitions_never_drop_what_stays_allowed() {
    let steps = [
        L3_L4.to_owned(),
        // Widen: all ports from client, plus db on 5432.
        r#"[{"labels":[{"key":"name","value":"l3-rule"}],"endpointSelector":{"matchLabels":{"app":"web"}},
            "ingress":[{"fromEndpoints":[{"matchLabels":{"app":"client"}}]},
                       {"fromEndpoints":[{"matchLabels":{"app":"db"}}],"toPorts":[{"ports":[{"port":"5432","protocol":"TCP"}]}]}]}]"#
            .to_owned(),
        // Add a deny for client on 443 and egress enforcement.
        r#"[{"labels":[{"key":"name","value":"l3-rule"}],"endpointSelector":{"matchLabels":{"app":"web"}},
            "ingress":[{"fromEndpoints":[{"matchLabels":{"app":"client"}}]}],
            "ingressDeny":[{"fromEndpoints":[{"matchLabels":{"app":"client"}}],"toPorts":[{"ports":[{"port":"443","protocol":"TCP"}]}]}],
            "egress":[{"toEntities":["cluster"]}]}]"#
            .to_owned(),
        // Back to the start: egress enforcement goes away again.
        L3_L4.to_owned(),
    ];
    let mut w = World::new();
    let mut old = w.policy("web");
    for s in steps {
        w.import(&s);
        let new = w.policy("web");
        assert_no_transient_drop(&w, &old, &new);
        old = new;
    }
    w.repo.delete_all();
    assert_no_transient_drop(&w, &old, &w.policy("web"));
}

#[test]
fn diff_orders_denies_first_and_removals_last() {
    let mut old = EndpointPolicy {
        ingress_enforced: true,
        ..EndpointPolicy::default()
    };
    old.entries
        .insert(PolicyEntry::new(Ingress, 300, TCP, 1, 1), Verdict::Allow);
    let mut new = old.clone();
    new.entries
        .remove(&PolicyEntry::new(Ingress, 300, TCP, 1, 1));
    new.entries
        .insert(PolicyEntry::new(Ingress, 300, TCP, 2, 2), Verdict::Allow);
    new.entries
        .insert(PolicyEntry::new(Ingress, 301, TCP, 2, 2), Verdict::Deny);
    new.egress_enforced = true;
    let d = plan(&old, &new);
    assert_eq!(
        d.add.iter().map(|(_, v)| *v).collect::<Vec<_>>(),
        [Verdict::Deny, Verdict::Allow]
    );
    assert_eq!(d.remove, [PolicyEntry::new(Ingress, 300, TCP, 1, 1)]);
    assert_eq!((d.ingress_enforced, d.egress_enforced), (None, Some(true)));
}
