//! Every file under testdata/policies parses (or fails with the documented error), and a
//! rejected import leaves the repository untouched.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    reason = "an integration test crate: its helpers panic with context like its tests (clippy.toml's allow-*-in-tests covers only #[test] functions)"
)]

use std::path::PathBuf;
use weft_policy::labels::{Label, LabelSet};
use weft_policy::mapstate::{Direction, proto};
use weft_policy::parse::parse_policy_file;
use weft_policy::repository::Repository;
use weft_policy::rule::{Entity, PeerSelector, PortProto, Rule};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testdata/policies")
}

fn load(name: &str) -> Result<Vec<Rule>, String> {
    let text = std::fs::read_to_string(dir().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    parse_policy_file(name, &text).map_err(|e| e.to_string())
}

fn ok(name: &str) -> Vec<Rule> {
    load(name).unwrap_or_else(|e| panic!("{name} should parse: {e}"))
}

fn has_label(r: &Rule, s: &str) -> bool {
    r.labels
        .contains(&Label::parse_with_source(s, "unspec").unwrap())
}

#[test]
fn every_valid_file_parses() {
    let mut n = 0;
    for e in std::fs::read_dir(dir()).unwrap() {
        let p = e.unwrap().path();
        if p.is_file() {
            ok(p.file_name().unwrap().to_str().unwrap());
            n += 1;
        }
    }
    assert!(n >= 9, "testdata went missing: {n} files");
}

#[test]
fn getting_started_rule() {
    let rules = ok("cilium-l3-rule.json");
    assert_eq!(rules.len(), 1);
    let r = &rules[0];
    assert!(has_label(r, "unspec:name=l3-rule"));
    assert_eq!(r.endpoint_selector.to_string(), "any:id=app1");
    assert!(r.applies(Direction::Ingress) && !r.applies(Direction::Egress));
    assert_eq!(r.ingress[0].peers.len(), 1);
    assert_eq!(r.ingress[0].peers[0].to_string(), "endpoints(any:id=app2)");
    assert_eq!(
        r.ingress[0].ports,
        [PortProto {
            proto: proto::TCP,
            lo: 80,
            hi: 80
        }]
    );
}

#[test]
fn cilium_cidr_entities_ports() {
    let rules = ok("cilium-cidr-entities.json");
    let egress = &rules[0].egress;
    assert_eq!(
        egress[0].peers[0].to_string(),
        "cidr(10.0.0.0/8 except 10.96.0.0/12)"
    );
    // ANY with a port: TCP, UDP and SCTP; toPorts without peers: every peer.
    assert_eq!(egress[1].peers, [PeerSelector::Entity(Entity::All)]);
    let protos: Vec<u8> = egress[1].ports.iter().map(|p| p.proto).collect();
    assert_eq!(protos, [proto::TCP, proto::UDP, proto::SCTP]);
    assert_eq!(
        egress[2].peers,
        [
            PeerSelector::Entity(Entity::Host),
            PeerSelector::Entity(Entity::Cluster)
        ]
    );
    let ingress = &rules[1].ingress;
    assert!(has_label(&rules[1], "k8s:team=frontend"));
    assert_eq!(ingress[1].peers.len(), 2, "a bare address is a /32");
    assert!(
        ingress[1]
            .peers
            .iter()
            .any(|p| p.to_string() == "cidr(172.16.1.1/32)")
    );
    assert_eq!(
        ingress[1].ports,
        [PortProto {
            proto: proto::TCP,
            lo: 8000,
            hi: 8080
        }]
    );
    let mut repo = Repository::new();
    repo.add(rules);
    let prefixes: Vec<String> = repo
        .cidr_prefixes()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        prefixes,
        [
            "10.0.0.0/8",
            "10.96.0.0/12",
            "172.16.1.1/32",
            "192.168.0.0/16"
        ]
    );
}

#[test]
fn cilium_deny_and_default_deny_switch() {
    let r = &ok("cilium-deny.json")[0];
    assert!(has_label(r, "unspec:name=deny-world-ssh"));
    assert!(r.default_deny(Direction::Ingress));
    assert!(r.applies(Direction::Egress) && !r.default_deny(Direction::Egress));
    assert_eq!(
        r.ingress_deny[0].peers,
        [PeerSelector::Entity(Entity::World)]
    );
}

#[test]
fn cnp_is_namespaced_and_labelled() {
    let r = &ok("cnp-l4.yaml")[0];
    assert_eq!(
        r.endpoint_selector.to_string(),
        "any:app=db,k8s:io.kubernetes.pod.namespace=shop"
    );
    let peers: Vec<String> = r.ingress[0].peers.iter().map(ToString::to_string).collect();
    assert_eq!(
        peers,
        [
            // An explicit namespace is kept, not overridden.
            "endpoints(any:app=backup,k8s:io.kubernetes.pod.namespace=ops)",
            "endpoints(any:app=web,k8s:io.kubernetes.pod.namespace=shop)",
        ]
    );
    for l in [
        "k8s:io.cilium.k8s.policy.derived-from=CiliumNetworkPolicy",
        "k8s:io.cilium.k8s.policy.name=db-from-web",
        "k8s:io.cilium.k8s.policy.namespace=shop",
    ] {
        assert!(has_label(r, l), "{l}");
    }
    assert_eq!(r.description, "only web talks to the database");
}

#[test]
fn cnp_specs_in_a_list() {
    let rules = ok("cnp-specs-list.yaml");
    assert_eq!(rules.len(), 2);
    assert!(rules[0].applies(Direction::Egress));
    assert_eq!(
        rules[0].egress[0].ports.len(),
        3,
        "no protocol = ANY = TCP/UDP/SCTP"
    );
    assert!(rules[1].applies(Direction::Ingress) && rules[1].ingress.is_empty());
    // Re-importing the object replaces both specs; identical ones are no change at all.
    let mut repo = Repository::new();
    repo.add(rules.clone());
    let change = repo.add(rules.clone());
    assert_eq!((change.removed.len(), repo.rules().len()), (0, 2));
    let mut edited = rules;
    edited.truncate(1);
    let change = repo.add(edited);
    assert_eq!(
        (change.removed.len(), repo.rules().len()),
        (1, 1),
        "the object now has one spec"
    );
}

#[test]
fn k8s_default_deny() {
    let r = &ok("k8s-default-deny.yaml")[0];
    assert!(r.default_deny(Direction::Ingress) && r.default_deny(Direction::Egress));
    assert!(r.ingress.is_empty() && r.egress.is_empty());
    assert!(has_label(
        r,
        "k8s:io.cilium.k8s.policy.derived-from=NetworkPolicy"
    ));
}

#[test]
fn k8s_namespace_selector() {
    let r = &ok("k8s-allow-from-namespace.yaml")[0];
    assert!(
        !r.applies(Direction::Egress),
        "policyTypes defaults to Ingress only"
    );
    let peers: Vec<String> = r.ingress[0].peers.iter().map(ToString::to_string).collect();
    assert!(peers.contains(
        &"endpoints(k8s:app=prom,k8s:io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name=monitoring,k8s:io.kubernetes.pod.namespace)".to_owned()
    ), "{peers:?}");
    assert!(
        peers.contains(
            &"endpoints(k8s:app=client,k8s:io.kubernetes.pod.namespace=default)".to_owned()
        ),
        "{peers:?}"
    );
    assert_eq!(
        r.ingress[0].ports,
        [PortProto {
            proto: proto::TCP,
            lo: 8080,
            hi: 8080
        }]
    );
    let prom = LabelSet::for_pod("monitoring", [("app", "prom")]);
    let sel = match &r.ingress[0].peers[0] {
        PeerSelector::Endpoints(s) => s,
        other => panic!("{other}"),
    };
    assert!(sel.matches(&prom) ^ sel.matches(&LabelSet::for_pod("default", [("app", "client")])));
}

#[test]
fn k8s_namespace_selector_on_any_key() {
    let r = &ok("k8s-namespace-label-any-key.yaml")[0];
    let sel = match &r.ingress[0].peers[0] {
        PeerSelector::Endpoints(s) => s,
        other => panic!("{other}"),
    };
    let pod = |team: &str| {
        let mut set = LabelSet::for_pod("shop", [("app", "client")]);
        set.insert(Label::new(
            "k8s",
            "io.cilium.k8s.namespace.labels.team",
            team,
        ));
        set
    };
    assert!(sel.matches(&pod("billing")));
    assert!(!sel.matches(&pod("ops")));
    assert!(!sel.matches(&LabelSet::for_pod("shop", [("app", "client")])));
}

#[test]
fn k8s_ipblock_and_port_range() {
    let r = &ok("k8s-ipblock-egress.yaml")[0];
    assert_eq!(
        r.ingress[0].peers[0].to_string(),
        "ipblock(172.17.0.0/16 except 172.17.1.0/24)"
    );
    assert_eq!(
        r.egress[0].ports,
        [
            PortProto {
                proto: proto::TCP,
                lo: 32000,
                hi: 32768
            },
            PortProto {
                proto: proto::UDP,
                lo: 53,
                hi: 53
            },
        ]
    );
}

#[test]
fn multi_document_file() {
    let rules = ok("multi-doc.yaml");
    assert_eq!(rules.len(), 2);
    assert_eq!(
        rules[0].ingress[0].peers,
        [PeerSelector::Entity(Entity::All)],
        "ingress: [{{}}] allows all"
    );
    assert!(rules[0].ingress[0].ports.is_empty());
}

/// Both APIs accept a CIDR with host bits set and mean the network it names (Cilium:
/// `netip.ParsePrefix` then `Masked()`; Kubernetes: `ParseCIDRSloppy`, the API server only
/// warns): enforced masked, with a warning naming the field.
#[test]
fn host_bits_are_masked_with_a_warning() {
    let text = std::fs::read_to_string(dir().join("cilium-cidr-host-bits.json")).unwrap();
    let parsed = weft_policy::parse::parse_noted("f.json", &text).unwrap();
    let peers: Vec<String> = parsed.rules[0]
        .egress
        .iter()
        .flat_map(|e| e.peers.iter().map(ToString::to_string))
        .collect();
    assert_eq!(
        peers,
        [
            "cidr(10.0.0.0/8)",
            "cidr(192.168.0.0/16 except 192.168.1.0/24)"
        ]
    );
    let notes: Vec<String> = parsed.notes.iter().map(ToString::to_string).collect();
    assert_eq!(
        notes,
        [
            r#"rule 0 (name "host-bits"): egress[0].toCIDR[0]: "10.0.0.1/8" has host bits set: enforced as 10.0.0.0/8, the network it names, as Cilium does (write 10.0.0.0/8)"#,
            r#"rule 0 (name "host-bits"): egress[1].toCIDRSet[0].cidr: "192.168.7.9/16" has host bits set: enforced as 192.168.0.0/16, the network it names, as Cilium does (write 192.168.0.0/16)"#,
            r#"rule 0 (name "host-bits"): egress[1].toCIDRSet[0].except[0]: "192.168.1.1/24" has host bits set: enforced as 192.168.1.0/24, the network it names, as Cilium does (write 192.168.1.0/24)"#,
        ]
    );
    assert!(
        parsed
            .notes
            .iter()
            .all(|n| n.kind == weft_policy::parse::NoteKind::Warning)
    );
    // The upstream e2e case: `<podIP>/4` in a NetworkPolicy; leading zeros read as decimal,
    // as Kubernetes' sloppy parser does.
    let np = |cidr: &str| {
        format!(
            "{{apiVersion: networking.k8s.io/v1, kind: NetworkPolicy, metadata: {{name: n}}, spec: {{podSelector: {{}}, policyTypes: [Egress], egress: [{{to: [{{ipBlock: {{cidr: \"{cidr}\"}}}}]}}]}}}}"
        )
    };
    let parsed = weft_policy::parse::parse_noted("np", &np("10.0.16.5/4")).unwrap();
    assert_eq!(
        parsed.rules[0].egress[0].peers[0].to_string(),
        "ipblock(0.0.0.0/4)"
    );
    assert!(
        parsed.notes[0]
            .to_string()
            .starts_with(r#"NetworkPolicy "default/n": spec.egress[0].to[0].ipBlock.cidr: "10.0.16.5/4" has host bits set"#),
        "{:?}",
        parsed.notes
    );
    let parsed = weft_policy::parse::parse_noted("np", &np("010.000.016.000/24")).unwrap();
    assert_eq!(
        parsed.rules[0].egress[0].peers[0].to_string(),
        "ipblock(10.0.16.0/24)"
    );
}

#[test]
fn named_ports_in_egress_rules_are_kept_by_name() {
    let r = &ok("np-egress-named-port.yaml")[0];
    let names = |i: usize| -> Vec<String> {
        r.egress[i]
            .named_ports
            .iter()
            .map(|n| format!("{}/{}", n.name, n.proto))
            .collect()
    };
    assert_eq!(r.egress[0].peers, [PeerSelector::Entity(Entity::All)]);
    assert!(r.egress[0].ports.is_empty());
    assert_eq!(names(0), ["http/6"]);
    assert_eq!(names(1), ["postgres/6"]);
    assert_eq!(
        r.egress[1].ports,
        [PortProto {
            proto: proto::TCP,
            lo: 9187,
            hi: 9187
        }]
    );
}

#[test]
fn invalid_files_fail_with_clear_errors() {
    let cases = [
        (
            "bad-port.json",
            r#"invalid/bad-port.json: rule 2 (name "x"): ingress[0].toPorts[0].ports[0].port: "Abc_1" is neither a port number (1-65535) nor a port name"#,
        ),
        (
            "port-out-of-range.json",
            r#"rule 0: egress[0].toPorts[0].ports[0].port: "70000" is not a port number (1-65535)"#,
        ),
        (
            "endport-below-port.json",
            "egress[0].toPorts[0].ports[0].endPort: endPort 8000 is below port 8080",
        ),
        (
            "unknown-field.json",
            r#"rule 0: ingress[0].fromEndpoint: unknown field "fromEndpoint""#,
        ),
        (
            "unsupported-entity.json",
            r#"ingress[0].fromEntities[0]: not supported yet: entity "remote-node""#,
        ),
        ("unknown-entity.json", r#"unknown entity "everything""#),
        (
            "except-outside.json",
            "toCIDRSet[0].except[0]: except 192.168.0.0/16 is not inside 10.0.0.0/8",
        ),
        (
            "l7-rules.json",
            r#"ingress[0].toPorts[0].rules: not supported yet: field "rules""#,
        ),
        (
            "fqdn.json",
            r#"egress[0].toFQDNs: not supported yet: field "toFQDNs""#,
        ),
        ("missing-selector.json", "rule 0: endpointSelector: missing"),
        (
            "syntax-error.json",
            "invalid/syntax-error.json: invalid JSON",
        ),
        (
            "bad-operator.yaml",
            r#"CiliumNetworkPolicy "default/bad-op": spec.endpointSelector.matchExpressions[0].operator: unknown operator "Equals""#,
        ),
        (
            "cnp-no-spec.yaml",
            "spec: missing (a CiliumNetworkPolicy needs spec or specs)",
        ),
        (
            "np-ipblock-named-egress.yaml",
            "spec.egress[0].ports: not supported yet: a named port (http) in an egress rule with an ipBlock peer (give the port number)",
        ),
        (
            "np-ipblock-mixed.yaml",
            "ipBlock cannot be combined with podSelector or namespaceSelector",
        ),
        ("kind-pod.yaml", r#"kind: unsupported kind "Pod""#),
        (
            "cnp-nodes-peer.yaml",
            r#"ClusterNetworkPolicy "to-control-plane": spec.egress[0].to[0].nodes: not supported yet: nodes peers"#,
        ),
        (
            "second-doc-bad.yaml",
            r#"document 1, NetworkPolicy "default/broken": spec.egress[0].to[0].ipBlock.cidr: "not-a-cidr" is not a CIDR"#,
        ),
        ("empty.yaml", "no policy rules in file"),
    ];
    let listed: Vec<&str> = cases.iter().map(|c| c.0).collect();
    for e in std::fs::read_dir(dir().join("invalid")).unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        assert!(
            listed.contains(&name.as_str()),
            "invalid/{name} has no expected error"
        );
    }
    for (file, want) in cases {
        let err = load(&format!("invalid/{file}")).expect_err(file);
        assert!(err.contains(want), "{file}:\n  got:  {err}\n  want: {want}");
    }
}

#[test]
fn rejected_import_leaves_repository_unchanged() {
    let mut repo = Repository::new();
    repo.add(ok("cilium-l3-rule.json"));
    let before = repo.clone();
    for bad in ["invalid/bad-port.json", "invalid/second-doc-bad.yaml"] {
        // The manager only calls add() with what parsed; a failed parse must yield nothing.
        if let Ok(rules) = load(bad) {
            repo.add(rules);
        }
    }
    assert_eq!(repo, before);
    assert_eq!(repo.revision(), 2);
}

#[test]
fn repository_with_every_example_roundtrips_through_json() {
    let mut repo = Repository::new();
    for e in std::fs::read_dir(dir()).unwrap() {
        let p = e.unwrap().path();
        if p.is_file() {
            repo.add(ok(p.file_name().unwrap().to_str().unwrap()));
        }
    }
    let json = serde_json::to_string(&repo).unwrap();
    let back: Repository = serde_json::from_str(&json).unwrap();
    assert_eq!(back, repo);
    assert!(repo.rules().len() >= 10);
}
