//! The `ClusterNetworkPolicy` translation: each field, the fail-closed cases and the errors.

use crate::labels::{Label, LabelSet, keys, source};
use crate::mapstate::{Direction, Tier, TierAction, proto};
use crate::parse::{NoteKind, Parsed, parse_cluster_object, parse_policy_file};
use crate::rule::{Enforcement, Entity, NamedPort, PeerSelector, PortProto, Rule};

fn object(spec: &str) -> String {
    format!(
        "apiVersion: policy.networking.k8s.io/v1beta1\nkind: ClusterNetworkPolicy\nmetadata: {{name: cnp-a, uid: u-1}}\nspec:\n{spec}"
    )
}

fn rules(spec: &str) -> Vec<Rule> {
    parse_policy_file("f", &object(spec)).unwrap_or_else(|e| panic!("{e}"))
}

fn cluster(spec: &str) -> Parsed {
    parse_cluster_object("f", &object(spec)).unwrap_or_else(|e| panic!("{e}"))
}

fn err(spec: &str) -> String {
    parse_policy_file("f", &object(spec))
        .unwrap_err()
        .to_string()
}

fn pod(ns: &str, labels: &[(&str, &str)], ns_labels: &[(&str, &str)]) -> LabelSet {
    let mut set = LabelSet::for_pod(ns, labels.iter().copied());
    for (k, v) in ns_labels {
        set.insert(Label::new(
            source::K8S,
            &format!("{}{k}", keys::NAMESPACE_LABELS_PREFIX),
            v,
        ));
    }
    set
}

fn endpoints(p: &PeerSelector) -> &crate::selector::Selector {
    match p {
        PeerSelector::Endpoints(s) => s,
        other => panic!("not an endpoint peer: {other}"),
    }
}

const FULL: &str = "  tier: Admin
  priority: 10
  subject:
    namespaces: {matchLabels: {team: a}}
  ingress:
  - name: deny-web
    action: Deny
    from: [{namespaces: {}}]
    protocols: [{tcp: {destinationPort: {number: 80}}}]
  - action: Pass
    from:
    - pods:
        namespaceSelector: {matchLabels: {team: b}}
        podSelector: {matchExpressions: [{key: app, operator: In, values: [db]}]}
    protocols: [{udp: {destinationPort: {range: {start: 53, end: 60}}}}, {sctp: {}}]
  egress:
  - name: to-nets
    action: Accept
    to: [{networks: [10.0.0.0/8, 'fd00::/8']}]
  - action: Deny
    to: [{pods: {podSelector: {}}}]
    protocols: [{destinationNamedPort: http}]
";

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one object's four rules checked field by field"
)]
fn one_rule_per_entry_with_its_tier_priority_index_and_action() {
    let r = rules(FULL);
    assert_eq!(r.len(), 4);
    let tiers: Vec<_> = r
        .iter()
        .map(|r| {
            let t = r.tier.as_ref().unwrap();
            (
                t.tier,
                t.priority,
                t.direction,
                t.index,
                t.action,
                t.name.as_str(),
            )
        })
        .collect();
    assert_eq!(
        tiers,
        [
            (
                Tier::Admin,
                10,
                Direction::Ingress,
                0,
                TierAction::Deny,
                "deny-web"
            ),
            (Tier::Admin, 10, Direction::Ingress, 1, TierAction::Pass, ""),
            (
                Tier::Admin,
                10,
                Direction::Egress,
                0,
                TierAction::Accept,
                "to-nets"
            ),
            (Tier::Admin, 10, Direction::Egress, 1, TierAction::Deny, ""),
        ]
    );
    for rule in &r {
        // The entry is in the allow section of its direction whatever the action; the
        // NetworkPolicy layer never sees the rule.
        let dir = rule.tier.as_ref().unwrap().direction;
        let (allow, deny) = rule.sections(dir);
        assert_eq!((allow.len(), deny.len()), (1, 0), "{rule:?}");
        let other = match dir {
            Direction::Ingress => Direction::Egress,
            Direction::Egress => Direction::Ingress,
        };
        assert!(rule.sections(other).0.is_empty() && rule.sections(other).1.is_empty());
        assert_eq!(rule.ingress_mode, Enforcement::NotApplied);
        assert_eq!(rule.egress_mode, Enforcement::NotApplied);
        // The object's labels, the same on every rule (replace and delete go by them), no
        // namespace: the kind is cluster-scoped.
        assert_eq!(rule.labels, r[0].labels);
        for l in [
            Label::new(
                source::K8S,
                keys::POLICY_DERIVED_FROM,
                "ClusterNetworkPolicy",
            ),
            Label::new(source::K8S, keys::POLICY_NAME, "cnp-a"),
            Label::new(source::K8S, keys::POLICY_UID, "u-1"),
        ] {
            assert!(rule.labels.contains(&l), "{l} missing: {:?}", rule.labels);
        }
        assert!(
            !rule.labels.iter().any(|l| l.key == keys::POLICY_NAMESPACE),
            "{:?}",
            rule.labels
        );
        // Subject: pods of namespaces labelled team=a, any pod there.
        let s = &rule.endpoint_selector;
        assert!(s.matches(&pod("x", &[("app", "web")], &[("team", "a")])));
        assert!(!s.matches(&pod("x", &[("app", "web")], &[("team", "b")])));
    }
    // ingress[0]: every pod, TCP 80.
    let e = &r[0].ingress[0];
    assert_eq!(e.peers.len(), 1);
    let every_pod = endpoints(&e.peers[0]);
    assert!(every_pod.matches(&pod("any", &[], &[])));
    assert_eq!(
        e.ports,
        [PortProto {
            proto: proto::TCP,
            lo: 80,
            hi: 80
        }]
    );
    // ingress[1]: app=db pods of team=b namespaces; UDP 53-60 and every SCTP port.
    let e = &r[1].ingress[0];
    let db = endpoints(&e.peers[0]);
    assert!(db.matches(&pod("n", &[("app", "db")], &[("team", "b")])));
    assert!(!db.matches(&pod("n", &[("app", "db")], &[("team", "a")])));
    assert!(!db.matches(&pod("n", &[("app", "web")], &[("team", "b")])));
    assert_eq!(
        e.ports,
        [
            PortProto {
                proto: proto::UDP,
                lo: 53,
                hi: 60
            },
            PortProto {
                proto: proto::SCTP,
                lo: 0,
                hi: u16::MAX
            },
        ]
    );
    // egress[0]: two CIDRs that also match pods by address; every port.
    let e = &r[2].egress[0];
    let nets: Vec<String> = e.peers.iter().map(ToString::to_string).collect();
    assert_eq!(nets, ["ipblock(10.0.0.0/8)", "ipblock(fd00::/8)"]);
    assert!(e.all_ports());
    // egress[1]: every pod, the named port on whichever protocol the pod gives it.
    let e = &r[3].egress[0];
    assert!(endpoints(&e.peers[0]).matches(&pod("z", &[("a", "b")], &[])));
    assert!(e.ports.is_empty());
    assert_eq!(
        e.named_ports,
        [proto::TCP, proto::UDP, proto::SCTP].map(|proto| NamedPort {
            proto,
            name: "http".into()
        })
    );
}

#[test]
fn namespace_peers_and_subjects_select_pods_only() {
    let r = rules(
        "  tier: Baseline\n  priority: 0\n  subject: {namespaces: {}}\n  egress:\n  - {action: Deny, to: [{namespaces: {}}]}\n",
    );
    let host: LabelSet = [Label::new(source::RESERVED, "host", "")]
        .into_iter()
        .collect();
    let world: LabelSet = [Label::new(source::RESERVED, "world", "")]
        .into_iter()
        .collect();
    let peer = endpoints(&r[0].egress[0].peers[0]);
    for s in [&r[0].endpoint_selector, peer] {
        assert!(s.matches(&pod("a", &[], &[])));
        assert!(s.matches(&pod("kube-system", &[("k", "v")], &[("x", "y")])));
        assert!(!s.matches(&host) && !s.matches(&world), "{s}");
    }
    assert_eq!(r[0].tier.as_ref().unwrap().tier, Tier::Baseline);
}

#[test]
fn a_pods_subject_without_namespace_selector_selects_in_every_namespace() {
    let r = rules(
        "  tier: Admin\n  priority: 3\n  subject: {pods: {podSelector: {matchLabels: {app: x}}}}\n  ingress:\n  - {action: Accept, from: [{namespaces: {matchLabels: {kubernetes.io/metadata.name: mon}}}]}\n",
    );
    let s = &r[0].endpoint_selector;
    assert!(s.matches(&pod("a", &[("app", "x")], &[])));
    assert!(s.matches(&pod("b", &[("app", "x")], &[])));
    assert!(!s.matches(&pod("b", &[("app", "y")], &[])));
    let peer = endpoints(&r[0].ingress[0].peers[0]);
    assert!(peer.matches(&pod("mon", &[], &[])));
    assert!(!peer.matches(&pod("other", &[], &[])));
}

#[test]
fn v1alpha2_reads_the_same() {
    let beta = object(FULL);
    let alpha = beta.replace("/v1beta1", "/v1alpha2");
    assert_ne!(alpha, beta);
    assert_eq!(
        parse_policy_file("f", &alpha).unwrap(),
        parse_policy_file("f", &beta).unwrap()
    );
}

#[test]
fn an_object_without_rules_gives_none_in_the_cluster_and_an_error_in_a_file() {
    let spec = "  tier: Admin\n  priority: 1\n  subject: {namespaces: {}}\n";
    assert!(cluster(spec).rules.is_empty());
    assert!(
        err(spec).contains("no policy rules in file"),
        "{}",
        err(spec)
    );
}

#[test]
fn unreadable_parts_fail_closed_in_the_cluster() {
    // Peers or protocols with none of the known fields (a newer CRD's), an unknown field.
    let spec = "  tier: Admin
  priority: 5
  subject: {namespaces: {}}
  ingress:
  - {name: a, action: Accept, from: [{namespaces: {}}, {newPeer: {}}]}
  - {name: b, action: Accept, from: [{namespaces: {}}]}
  - {name: c, action: Deny, from: [{namespaces: {}}], protocols: [{icmp: {}}]}
  - {name: d, action: Pass, from: [{pods: {podSelector: {}, other: 1}}]}
  egress:
  - {name: e, action: Accept, to: [{networks: [10.0.0.0/8]}], newMatch: x}
";
    let p = cluster(spec);
    // The Accept rule "a" matches nothing: no rule; "b" keeps its index.
    let got: Vec<_> = p
        .rules
        .iter()
        .map(|r| {
            let t = r.tier.as_ref().unwrap();
            (t.name.as_str(), t.index, t.action)
        })
        .collect();
    assert_eq!(
        got,
        [
            ("b", 1, TierAction::Accept),
            ("c", 2, TierAction::Deny),
            ("d", 3, TierAction::Deny),
        ]
    );
    // Deny and Pass rules deny everything of their direction.
    for r in &p.rules[1..] {
        assert_eq!(r.ingress.len(), 1);
        assert_eq!(r.ingress[0].peers, [PeerSelector::Entity(Entity::All)]);
        assert!(r.ingress[0].all_ports());
    }
    let notes: Vec<String> = p.notes.iter().map(ToString::to_string).collect();
    assert!(p.notes.iter().all(|n| n.kind == NoteKind::NotEnforced));
    assert_eq!(
        notes,
        [
            "spec.ingress[0].from[1].newPeer: unknown field \"newPeer\"; this Accept rule matches nothing (fail closed)",
            "spec.ingress[2].protocols[0].icmp: unknown field \"icmp\"; this Deny rule denies all traffic of its direction (fail closed)",
            "spec.ingress[3].from[0].pods.other: unknown field \"other\"; this Pass rule denies all traffic of its direction (fail closed)",
            "spec.egress[0].newMatch: unknown field \"newMatch\"; this Accept rule matches nothing (fail closed)",
        ]
    );
    // In a file each is an error.
    let e = err(spec);
    assert!(
        e.contains("spec.ingress[0].from[1].newPeer: unknown field \"newPeer\""),
        "{e}"
    );
}

#[test]
fn a_peer_or_protocol_with_no_field_set_fails_closed() {
    let p = cluster(
        "  tier: Baseline\n  priority: 5\n  subject: {namespaces: {}}\n  egress:\n  - {action: Pass, to: [{}]}\n  - {action: Accept, to: [{namespaces: {}}], protocols: [{}]}\n",
    );
    assert_eq!(p.rules.len(), 1, "{:?}", p.rules);
    assert_eq!(
        p.rules[0].egress[0].peers,
        [PeerSelector::Entity(Entity::All)]
    );
    let notes: Vec<String> = p.notes.iter().map(ToString::to_string).collect();
    assert_eq!(
        notes,
        [
            "spec.egress[0].to[0]: a peer needs one of namespaces, pods, nodes, networks or domainNames; this Pass rule denies all traffic of its direction (fail closed)",
            "spec.egress[1].protocols[0]: a protocol needs one of tcp, udp, sctp or destinationNamedPort; this Accept rule matches nothing (fail closed)",
        ]
    );
}

#[test]
#[expect(clippy::too_many_lines, reason = "a table of cases")]
fn error_table() {
    let subj = "  subject: {namespaces: {}}\n";
    let head = format!("  tier: Admin\n  priority: 1\n{subj}");
    let ing = |rule: &str| format!("{head}  ingress:\n  - {rule}\n");
    let eg = |rule: &str| format!("{head}  egress:\n  - {rule}\n");
    let many: String = (0..26)
        .map(|_| "  - {action: Deny, from: [{namespaces: {}}]}\n")
        .collect();
    let cases = [
        (
            format!("  priority: 1\n{subj}"),
            "spec.tier: missing (Admin or Baseline)".to_owned(),
        ),
        (
            format!("  tier: admin\n  priority: 1\n{subj}"),
            "spec.tier: unknown tier \"admin\" (expected Admin or Baseline)".into(),
        ),
        (
            format!("  tier: Admin\n{subj}"),
            "spec.priority: missing (a number from 0 to 1000, lower first)".into(),
        ),
        (
            format!("  tier: Admin\n  priority: 1001\n{subj}"),
            "spec.priority: 1001 is not a priority (from 0 to 1000, lower first)".into(),
        ),
        (
            format!("  tier: Admin\n  priority: -1\n{subj}"),
            "spec.priority: -1 is not a priority".into(),
        ),
        (
            format!("  tier: Admin\n  priority: high\n{subj}"),
            "spec.priority: expected a number from 0 to 1000, lower first, got a string".into(),
        ),
        (
            "  tier: Admin\n  priority: 1\n".into(),
            "spec.subject: missing (namespaces: {} selects every pod)".into(),
        ),
        (
            "  tier: Admin\n  priority: 1\n  subject: {}\n".into(),
            "spec.subject: subject needs one of namespaces or pods".into(),
        ),
        (
            "  tier: Admin\n  priority: 1\n  subject: {namespaces: {}, pods: {podSelector: {}}}\n"
                .into(),
            "spec.subject.pods: subject takes exactly one of namespaces or pods, not both namespaces and pods".into(),
        ),
        (
            "  tier: Admin\n  priority: 1\n  subject: {pods: {namespaceSelector: {}}}\n".into(),
            "spec.subject.pods.podSelector: missing (podSelector: {} selects every pod of the selected namespaces)".into(),
        ),
        (
            "  tier: Admin\n  priority: 1\n  subject: {namespaces: {matchLabels: {'': x}}}\n"
                .into(),
            "spec.subject.namespaces.matchLabels.: empty label key".into(),
        ),
        (
            format!("{head}  ingress:\n{many}"),
            "spec.ingress: 26 rules, at most 25 are allowed".into(),
        ),
        (
            ing("{from: [{namespaces: {}}]}"),
            "spec.ingress[0].action: missing (Accept, Deny or Pass)".into(),
        ),
        (
            ing("{action: Allow, from: [{namespaces: {}}]}"),
            "spec.ingress[0].action: unknown action \"Allow\" (expected Accept, Deny or Pass)"
                .into(),
        ),
        (
            ing("{action: Deny}"),
            "spec.ingress[0].from: needs at least one peer (namespaces: {} is every pod)".into(),
        ),
        (
            ing("{action: Deny, from: []}"),
            "spec.ingress[0].from: needs at least one peer".into(),
        ),
        (
            ing(&format!(
                "{{name: {}, action: Deny, from: [{{namespaces: {{}}}}]}}",
                "n".repeat(101)
            )),
            "spec.ingress[0].name: longer than 100 characters".into(),
        ),
        (
            ing("{action: Deny, from: [{namespaces: {}, pods: {podSelector: {}}}]}"),
            "spec.ingress[0].from[0].pods: a peer takes exactly one of namespaces or pods, not both namespaces and pods".into(),
        ),
        (
            ing("{action: Deny, from: [{networks: [10.0.0.0/8]}]}"),
            "spec.ingress[0].from[0].networks: unknown field \"networks\"".into(),
        ),
        (
            eg("{action: Deny, to: [{nodes: {}}]}"),
            "spec.egress[0].to[0].nodes: not supported yet: nodes peers (select the nodes' addresses with networks instead)".into(),
        ),
        (
            eg("{action: Accept, to: [{domainNames: [example.com]}]}"),
            "spec.egress[0].to[0].domainNames: not supported yet: domainNames peers".into(),
        ),
        (
            eg("{action: Deny, to: [{networks: [10.0.0.0/33]}]}"),
            "spec.egress[0].to[0].networks[0]: \"10.0.0.0/33\" is not a CIDR".into(),
        ),
        (
            eg("{action: Deny, to: [{networks: []}]}"),
            "spec.egress[0].to[0].networks: needs at least one CIDR".into(),
        ),
        (
            eg("{action: Deny, to: [{networks: [10.0.0.0/8]}], protocols: [{destinationNamedPort: http}]}"),
            "spec.egress[0].protocols: destinationNamedPort cannot be used with networks peers".into(),
        ),
        (
            ing("{action: Deny, from: [{namespaces: {}}], protocols: []}"),
            "spec.ingress[0].protocols: an empty list (leave protocols out to match every protocol and port)".into(),
        ),
        (
            ing("{action: Deny, from: [{namespaces: {}}], protocols: [{tcp: {}, udp: {}}]}"),
            "spec.ingress[0].protocols[0].udp: a protocol takes exactly one of tcp, udp, sctp or destinationNamedPort, not both tcp and udp".into(),
        ),
        (
            ing("{action: Deny, from: [{namespaces: {}}], protocols: [{tcp: {destinationPort: {number: 0}}}]}"),
            "spec.ingress[0].protocols[0].tcp.destinationPort.number: 0 is not a port number (1-65535)".into(),
        ),
        (
            ing("{action: Deny, from: [{namespaces: {}}], protocols: [{tcp: {destinationPort: {number: 65536}}}]}"),
            "destinationPort.number: 65536 is not a port number (1-65535)".into(),
        ),
        (
            ing("{action: Deny, from: [{namespaces: {}}], protocols: [{udp: {destinationPort: {range: {start: 90, end: 90}}}}]}"),
            "spec.ingress[0].protocols[0].udp.destinationPort.range.end: end 90 must be above start 90 (for a single port give number)".into(),
        ),
        (
            ing("{action: Deny, from: [{namespaces: {}}], protocols: [{udp: {destinationPort: {range: {end: 90}}}}]}"),
            "spec.ingress[0].protocols[0].udp.destinationPort.range.start: missing".into(),
        ),
        (
            ing("{action: Deny, from: [{namespaces: {}}], protocols: [{destinationNamedPort: HTTP}]}"),
            "spec.ingress[0].protocols[0].destinationNamedPort: \"HTTP\" is not a port name".into(),
        ),
        (
            ing("{action: Deny, from: [{namespaces: {}}], protocols: [{destinationNamedPort: '8080'}]}"),
            "\"8080\" is not a port name".into(),
        ),
        (
            ing("{action: Deny, from: [{pods: {namespaceSelector: {}}}]}"),
            "spec.ingress[0].from[0].pods.podSelector: missing".into(),
        ),
    ];
    for (spec, want) in &cases {
        let got = err(spec);
        assert!(got.contains(want), "{spec}\n  got:  {got}\n  want: {want}");
        assert!(
            got.starts_with("f: ClusterNetworkPolicy \"cnp-a\": "),
            "{got}"
        );
        // The cluster rejects these too, except unknown fields: those fail closed.
        let in_cluster = parse_cluster_object("f", &object(spec));
        assert_eq!(
            in_cluster.is_err(),
            !want.contains("unknown field"),
            "{spec}"
        );
    }
}

#[test]
fn a_wrong_api_version_is_named() {
    let text = object(FULL).replace(
        "policy.networking.k8s.io/v1beta1",
        "policy.networking.k8s.io/v1",
    );
    let e = parse_policy_file("f", &text).unwrap_err().to_string();
    assert!(
        e.contains("apiVersion: unsupported apiVersion \"policy.networking.k8s.io/v1\" (expected policy.networking.k8s.io/v1beta1 or policy.networking.k8s.io/v1alpha2)"),
        "{e}"
    );
}
