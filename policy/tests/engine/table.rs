//! Table of flows: policy, subject endpoint, direction, peer, protocol, port → verdict.
//! Every row is also checked against `trace` and the deny invariant (see `World::verdict`).

use crate::world::World;
use weft_policy::mapstate::Direction::{Egress, Ingress};
use weft_policy::mapstate::Verdict::{Allow, Deny};
use weft_policy::mapstate::proto::{SCTP, TCP, UDP};
use weft_policy::mapstate::{Direction, Verdict};

const L3_L4: &str = r#"[{"labels":[{"key":"name","value":"l3-rule"}],
  "endpointSelector":{"matchLabels":{"app":"web"}},
  "ingress":[{"fromEndpoints":[{"matchLabels":{"app":"client"}}],
              "toPorts":[{"ports":[{"port":"80","protocol":"TCP"}]}]}]}]"#;

const CNP_L3_L4: &str = r#"
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: l3, namespace: default}
spec:
  endpointSelector: {matchLabels: {app: web}}
  ingress:
  - fromEndpoints: [{matchLabels: {app: client}}]
    toPorts: [{ports: [{port: "80", protocol: TCP}]}]
"#;

fn ingress_from(peer: &str) -> String {
    format!(r#"[{{"endpointSelector":{{"matchLabels":{{"app":"web"}}}},"ingress":[{{{peer}}}]}}]"#)
}

fn egress_to(peer: &str) -> String {
    format!(r#"[{{"endpointSelector":{{"matchLabels":{{"app":"web"}}}},"egress":[{{{peer}}}]}}]"#)
}

fn np(spec: &str) -> String {
    format!(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{name: np, namespace: default}}\nspec:\n{spec}"
    )
}

struct Case {
    name: &'static str,
    policies: Vec<String>,
    ep: &'static str,
    dir: Direction,
    peer: &'static str,
    proto: u8,
    port: u16,
    want: Verdict,
}

#[expect(
    clippy::too_many_lines,
    reason = "a flat table reads best in one place"
)]
#[rustfmt::skip]
fn cases() -> Vec<Case> {
    let c = |name, policies: &[&str], ep, dir, peer, proto, port, want| Case {
        name,
        policies: policies.iter().map(|s| (*s).to_owned()).collect(),
        ep,
        dir,
        peer,
        proto,
        port,
        want,
    };
    let world_443 = ingress_from(
        r#""fromEntities":["world"],"toPorts":[{"ports":[{"port":"443","protocol":"TCP"}]}]"#,
    );
    let cidr_set = egress_to(r#""toCIDRSet":[{"cidr":"10.0.0.0/8","except":["10.96.0.0/12"]}]"#);
    let to_cidr = egress_to(r#""toCIDR":["10.0.0.0/8"]"#);
    let to_default = egress_to(r#""toCIDR":["0.0.0.0/0"]"#);
    let range = ingress_from(
        r#""fromEntities":["all"],"toPorts":[{"ports":[{"port":"8000","endPort":8080,"protocol":"TCP"}]}]"#,
    );
    let any53 = egress_to(r#""toPorts":[{"ports":[{"port":"53","protocol":"ANY"}]}]"#);
    let all_tcp = ingress_from(
        r#""fromEntities":["all"],"toPorts":[{"ports":[{"port":"0","protocol":"TCP"}]}]"#,
    );
    let no_ports = ingress_from(r#""fromEndpoints":[{"matchLabels":{"app":"client"}}]"#);
    let deny_client = r#"[{"endpointSelector":{"matchLabels":{"app":"web"}},
        "ingress":[{"fromEntities":["all"]}],
        "ingressDeny":[{"fromEndpoints":[{"matchLabels":{"app":"client"}}]}]}]"#;
    let deny_22 = r#"[{"endpointSelector":{"matchLabels":{"app":"web"}},
        "ingress":[{"fromEntities":["all"]}],
        "ingressDeny":[{"toPorts":[{"ports":[{"port":"22","protocol":"TCP"}]}]}]}]"#;
    let deny_world_allow_cidr = r#"[{"endpointSelector":{"matchLabels":{"app":"web"}},
        "egress":[{"toCIDR":["10.0.0.0/8"]}],
        "egressDeny":[{"toEntities":["world"]}]}]"#;
    let deny_narrow_cidr = r#"[{"endpointSelector":{"matchLabels":{"app":"web"}},
        "egress":[{"toCIDR":["10.0.0.0/8"]}],
        "egressDeny":[{"toCIDR":["10.1.0.0/16"]}]}]"#;
    let deny_only = r#"[{"endpointSelector":{"matchLabels":{"app":"web"}},
        "ingressDeny":[{"fromEndpoints":[{"matchLabels":{"app":"db"}}]}]}]"#;
    let deny_no_default = r#"[{"endpointSelector":{"matchLabels":{"app":"web"}},
        "ingressDeny":[{"fromEndpoints":[{"matchLabels":{"app":"db"}}]}],
        "enableDefaultDeny":{"ingress":false}}]"#;
    let shadow = r#"[{"endpointSelector":{"matchLabels":{"app":"web"}},
        "ingress":[{"fromEndpoints":[{"matchLabels":{"app":"client"}}],"toPorts":[{"ports":[{"port":"80","protocol":"TCP"}]}]}],
        "ingressDeny":[{"fromEndpoints":[{"matchLabels":{"app":"client"}}]}]}]"#;
    let partial = r#"[{"endpointSelector":{"matchLabels":{"app":"web"}},
        "ingress":[{"fromEndpoints":[{"matchLabels":{"app":"client"}}],"toPorts":[{"ports":[{"port":"80","endPort":90,"protocol":"TCP"}]}]}],
        "ingressDeny":[{"toPorts":[{"ports":[{"port":"85","protocol":"TCP"}]}]}]}]"#;
    let union_b = r#"[{"labels":["name=b"],"endpointSelector":{"matchLabels":{"app":"web"}},
        "ingress":[{"fromEndpoints":[{"matchLabels":{"app":"db"}}],"toPorts":[{"ports":[{"port":"5432","protocol":"TCP"}]}]}]}]"#;
    let np_deny_ingress = np("  podSelector: {}\n  policyTypes: [Ingress]\n");
    let np_from_ns = np(
        "  podSelector: {matchLabels: {app: web}}\n  ingress:\n  - from:\n    - namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: prod}}\n",
    );
    let np_all = np("  podSelector: {matchLabels: {app: web}}\n  ingress:\n  - {}\n");
    let np_empty_from = np(
        "  podSelector: {matchLabels: {app: web}}\n  ingress:\n  - from: []\n    ports: [{port: 80}]\n",
    );
    let np_same_ns = np(
        "  podSelector: {matchLabels: {app: web}}\n  ingress:\n  - from: [{podSelector: {matchLabels: {app: client}}}]\n",
    );
    let np_ipblock = np(
        "  podSelector: {matchLabels: {app: web}}\n  policyTypes: [Egress]\n  egress:\n  - to: [{ipBlock: {cidr: 172.17.0.0/16, except: [172.17.1.0/24]}}]\n",
    );
    let np_egress_none = np("  podSelector: {}\n  policyTypes: [Egress]\n  egress: []\n");
    let np_port_only =
        np("  podSelector: {matchLabels: {app: web}}\n  ingress:\n  - ports: [{protocol: TCP}]\n");
    let np_any_ns = np(
        "  podSelector: {matchLabels: {app: web}}\n  ingress:\n  - from: [{namespaceSelector: {}, podSelector: {matchLabels: {app: client}}}]\n",
    );
    let in_expr = ingress_from(
        r#""fromEndpoints":[{"matchExpressions":[{"key":"app","operator":"In","values":["db","prom"]},{"key":"tier","operator":"DoesNotExist"}]}]"#,
    );
    let ingress_empty = ingress_from("");
    let wildcard = ingress_from(r#""fromEndpoints":[{}]"#);
    let reserved_host = egress_to(r#""toEndpoints":[{"matchLabels":{"reserved:host":""}}]"#);
    let cnp_wildcard = "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata: {name: w}\nspec:\n  endpointSelector: {matchLabels: {app: web}}\n  ingress: [{fromEndpoints: [{}]}]\n";
    vec![
        c("l3/l4 allows client:80/tcp", &[L3_L4], "web", Ingress, "ep:client", TCP, 80, Allow),
        c("l3/l4 denies other port", &[L3_L4], "web", Ingress, "ep:client", TCP, 81, Deny),
        c("l3/l4 denies other protocol", &[L3_L4], "web", Ingress, "ep:client", UDP, 80, Deny),
        c("l3/l4 denies other endpoint", &[L3_L4], "web", Ingress, "ep:db", TCP, 80, Deny),
        c("not selected: default allow", &[L3_L4], "db", Ingress, "ep:prom", TCP, 1, Allow),
        c("egress not enforced by ingress rule", &[L3_L4], "web", Egress, "ip:8.8.8.8", UDP, 53, Allow),
        c("host always allowed at ingress", &[L3_L4], "web", Ingress, "host", TCP, 10250, Allow),
        c("plain JSON is cluster-wide", &[L3_L4], "web", Ingress, "ep:prod-client", TCP, 80, Allow),
        c("CNP peers are namespaced", &[CNP_L3_L4], "web", Ingress, "ep:prod-client", TCP, 80, Deny),
        c("CNP allows same namespace", &[CNP_L3_L4], "web", Ingress, "ep:client", TCP, 80, Allow),
        c("entity world from internet", &[&world_443], "web", Ingress, "ip:8.8.8.8", TCP, 443, Allow),
        c("entity world includes CIDR identities", &[&world_443, &to_cidr], "web", Ingress, "ip:10.1.1.1", TCP, 443, Allow),
        c("entity world excludes endpoints", &[&world_443], "web", Ingress, "ep:client", TCP, 443, Deny),
        c("entity host at egress", &[&egress_to(r#""toEntities":["host"]"#)], "web", Egress, "host", TCP, 22, Allow),
        c("entity host is not world", &[&egress_to(r#""toEntities":["host"]"#)], "web", Egress, "world", TCP, 22, Deny),
        c("entity cluster: endpoints", &[&egress_to(r#""toEntities":["cluster"]"#)], "web", Egress, "ep:prom", TCP, 9090, Allow),
        c("entity cluster: host", &[&egress_to(r#""toEntities":["cluster"]"#)], "web", Egress, "host", UDP, 53, Allow),
        c("entity cluster: not world", &[&egress_to(r#""toEntities":["cluster"]"#)], "web", Egress, "ip:1.1.1.1", TCP, 443, Deny),
        c("entity all", &[&egress_to(r#""toEntities":["all"]"#)], "web", Egress, "ip:1.1.1.1", TCP, 443, Allow),
        c("toCIDR inside", &[&to_cidr], "web", Egress, "ip:10.1.2.3", TCP, 443, Allow),
        c("toCIDR outside", &[&to_cidr], "web", Egress, "ip:11.0.0.1", TCP, 443, Deny),
        c("CIDRSet except carved out", &[&cidr_set], "web", Egress, "ip:10.96.0.1", TCP, 443, Deny),
        c("CIDRSet rest allowed", &[&cidr_set], "web", Egress, "ip:10.112.0.1", TCP, 443, Allow),
        c("toCIDR 0.0.0.0/0 is world", &[&to_default], "web", Egress, "ip:8.8.8.8", TCP, 443, Allow),
        c("port range upper bound", &[&range], "web", Ingress, "ip:8.8.8.8", TCP, 8080, Allow),
        c("port range past end", &[&range], "web", Ingress, "ip:8.8.8.8", TCP, 8081, Deny),
        c("ANY port: udp", &[&any53], "web", Egress, "ep:db", UDP, 53, Allow),
        c("ANY port: tcp", &[&any53], "web", Egress, "ep:db", TCP, 53, Allow),
        c("ANY port: sctp", &[&any53], "web", Egress, "ep:db", SCTP, 53, Allow),
        c("ANY port: other port", &[&any53], "web", Egress, "ep:db", UDP, 54, Deny),
        c("port 0 = all tcp ports", &[&all_tcp], "web", Ingress, "ep:db", TCP, 12345, Allow),
        c("port 0 tcp only", &[&all_tcp], "web", Ingress, "ep:db", UDP, 12345, Deny),
        c("no toPorts = all ports and protocols", &[&no_ports], "web", Ingress, "ep:client", UDP, 5000, Allow),
        c("matchExpressions In + DoesNotExist", &[&in_expr], "web", Ingress, "ep:prom", TCP, 1, Allow),
        c("matchExpressions DoesNotExist excludes", &[&in_expr], "web", Ingress, "ep:db", TCP, 1, Deny),
        c("plain fromEndpoints {} is the L3 wildcard", &[&wildcard], "web", Ingress, "ip:8.8.8.8", TCP, 80, Allow),
        c("CNP fromEndpoints {}: own namespace", &[cnp_wildcard], "web", Ingress, "ep:client", TCP, 80, Allow),
        c("CNP fromEndpoints {}: not other namespaces", &[cnp_wildcard], "web", Ingress, "ep:prod-client", TCP, 80, Deny),
        c("CNP fromEndpoints {}: not world", &[cnp_wildcard], "web", Ingress, "ip:8.8.8.8", TCP, 80, Deny),
        c("reserved:host selector", &[&reserved_host], "web", Egress, "host", TCP, 22, Allow),
        c("reserved:host selector: not endpoints", &[&reserved_host], "web", Egress, "ep:db", TCP, 22, Deny),
        c("ingress [{}] enforces, allows nothing", &[&ingress_empty], "web", Ingress, "ep:client", TCP, 80, Deny),
        c("deny beats allow-all", &[deny_client], "web", Ingress, "ep:client", TCP, 80, Deny),
        c("deny leaves others allowed", &[deny_client], "web", Ingress, "ep:db", TCP, 80, Allow),
        c("deny port 22", &[deny_22], "web", Ingress, "ep:db", TCP, 22, Deny),
        c("deny port 22 keeps 80", &[deny_22], "web", Ingress, "ep:db", TCP, 80, Allow),
        c("deny world covers CIDR allow", &[deny_world_allow_cidr], "web", Egress, "ip:10.1.1.1", TCP, 80, Deny),
        c("deny narrow CIDR inside allow", &[deny_narrow_cidr], "web", Egress, "ip:10.1.1.1", TCP, 80, Deny),
        c("allow CIDR outside deny", &[deny_narrow_cidr], "web", Egress, "ip:10.2.1.1", TCP, 80, Allow),
        c("deny-only rule enforces default deny", &[deny_only], "web", Ingress, "ep:client", TCP, 80, Deny),
        c("enableDefaultDeny false keeps others", &[deny_no_default], "web", Ingress, "ep:client", TCP, 80, Allow),
        c("enableDefaultDeny false still denies", &[deny_no_default], "web", Ingress, "ep:db", TCP, 80, Deny),
        c("broad deny beats narrower allow, same id", &[shadow], "web", Ingress, "ep:client", TCP, 80, Deny),
        c("partial overlap: denied port", &[partial], "web", Ingress, "ep:client", TCP, 85, Deny),
        c("partial overlap: rest of range", &[partial], "web", Ingress, "ep:client", TCP, 84, Allow),
        c("union of rules: a", &[L3_L4, union_b], "web", Ingress, "ep:client", TCP, 80, Allow),
        c("union of rules: b", &[L3_L4, union_b], "web", Ingress, "ep:db", TCP, 5432, Allow),
        c("NP default deny ingress", &[&np_deny_ingress], "web", Ingress, "ep:client", TCP, 80, Deny),
        c("NP default deny: egress free", &[&np_deny_ingress], "web", Egress, "ep:client", TCP, 80, Allow),
        c("NP default deny: other namespace untouched", &[&np_deny_ingress], "prod-client", Ingress, "ep:web", TCP, 80, Allow),
        c("NP namespaceSelector match", &[&np_from_ns], "web", Ingress, "ep:prod-client", TCP, 80, Allow),
        c("NP namespaceSelector other ns", &[&np_from_ns], "web", Ingress, "ep:client", TCP, 80, Deny),
        c("NP ingress [{}] allows all", &[&np_all], "web", Ingress, "ip:8.8.8.8", UDP, 9, Allow),
        c("NP from [] = all sources", &[&np_empty_from], "web", Ingress, "ip:8.8.8.8", TCP, 80, Allow),
        c("NP from [] keeps port", &[&np_empty_from], "web", Ingress, "ip:8.8.8.8", TCP, 81, Deny),
        c("NP podSelector is same namespace", &[&np_same_ns], "web", Ingress, "ep:prod-client", TCP, 80, Deny),
        c("NP podSelector allows", &[&np_same_ns], "web", Ingress, "ep:client", TCP, 80, Allow),
        c("NP ipBlock", &[&np_ipblock], "web", Egress, "ip:172.17.2.1", TCP, 80, Allow),
        c("NP ipBlock except", &[&np_ipblock], "web", Egress, "ip:172.17.1.1", TCP, 80, Deny),
        c("NP egress: [] denies all egress", &[&np_egress_none], "web", Egress, "ep:db", TCP, 80, Deny),
        c("NP port without number: all TCP", &[&np_port_only], "web", Ingress, "ep:db", TCP, 31337, Allow),
        c("NP port without number: not UDP", &[&np_port_only], "web", Ingress, "ep:db", UDP, 53, Deny),
        c("NP namespaceSelector {} = every namespace", &[&np_any_ns], "web", Ingress, "ep:prod-client", TCP, 80, Allow),
    ]
}

#[test]
fn flow_table() {
    let cases = cases();
    assert!(cases.len() >= 30);
    let mut failures = Vec::new();
    for case in cases {
        let mut w = World::new();
        for p in &case.policies {
            w.import(p);
        }
        let got = w.verdict(case.ep, case.dir, case.peer, case.proto, case.port);
        if got != case.want {
            failures.push(format!(
                "{}: {} {:?} {} proto {} port {}: got {got:?}, want {:?}\n  policy: {:?}",
                case.name,
                case.ep,
                case.dir,
                case.peer,
                case.proto,
                case.port,
                case.want,
                w.policy(case.ep)
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
