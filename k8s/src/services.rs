//! Service translation: a Service and its `EndpointSlices` become the frontends the datapath
//! translates (`ClusterIP`, port, protocol) with the ready backends of each, by kube-proxy's
//! rules (pkg/proxy/endpointslicecache.go, topology.go):
//!
//! - `ExternalName` and headless (`clusterIP: None`) Services have no frontends, nor do those
//!   labelled `service.kubernetes.io/service-proxy-name` (they belong to another proxy, which
//!   kube-proxy and Cilium leave them to). Every other Service has one frontend per address of
//!   `spec.clusterIPs` (dual-stack: one per family) and `spec.ports` entry.
//! - A frontend's backends come from the Service's `EndpointSlices` (label
//!   `kubernetes.io/service-name`, same namespace) of its address family: the slice port of the
//!   same name and protocol gives the port, each ready endpoint (`ready` absent counts as ready)
//!   its addresses. When none is ready, the serving terminating ones are used, so connections
//!   still land during a rollout's last moments. `internalTrafficPolicy: Local` keeps only the
//!   endpoints on this node.
//!
//! Only `ClusterIP` frontends are translated: node ports, `externalIPs` and load-balancer
//! addresses of the same Service are left to kube-proxy. `sessionAffinity: ClientIP` is not
//! honoured (each new connection picks a backend); nor are topology hints or
//! `trafficDistribution`.
//!
//! [`ServiceTable`] holds the cluster's Services and `EndpointSlices` for the watchers and says
//! which Services' translation changed.

use k8s_openapi::api::core::v1::{Service, ServicePort};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use weft_api::lb::{Backend, Frontend, LbProto};

/// The label that ties an `EndpointSlice` to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// A Service with this label is served by the named proxy, not by the default one.
pub const SERVICE_PROXY_NAME_LABEL: &str = "service.kubernetes.io/service-proxy-name";

/// A Service's translation: its frontends, each with its backends (sorted, no duplicates).
pub type Frontends = Vec<(Frontend, Vec<Backend>)>;

fn proto(p: Option<&str>) -> Option<LbProto> {
    match p.unwrap_or("TCP") {
        "TCP" => Some(LbProto::Tcp),
        "UDP" => Some(LbProto::Udp),
        "SCTP" => Some(LbProto::Sctp),
        _ => None,
    }
}

fn address_type(addr: IpAddr) -> &'static str {
    if addr.is_ipv4() { "IPv4" } else { "IPv6" }
}

/// The Service's `ClusterIPs`; none for `ExternalName`, headless and other proxies' Services.
fn cluster_ips(svc: &Service) -> Vec<IpAddr> {
    let Some(spec) = &svc.spec else {
        return Vec::new();
    };
    let other_proxy = svc
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(SERVICE_PROXY_NAME_LABEL));
    if other_proxy || spec.type_.as_deref() == Some("ExternalName") {
        return Vec::new();
    }
    let ips: Vec<&String> = match &spec.cluster_ips {
        Some(ips) if !ips.is_empty() => ips.iter().collect(),
        _ => spec.cluster_ip.iter().collect(),
    };
    ips.into_iter()
        .filter(|ip| !ip.is_empty() && *ip != "None")
        .filter_map(|ip| {
            ip.parse()
                .inspect_err(|_| {
                    tracing::warn!(
                        service = ?svc.metadata.name,
                        "clusterIP {ip:?} is not an IP address: not translated"
                    );
                })
                .ok()
        })
        .collect()
}

/// Whether `slice` belongs to `svc` (its label, its namespace).
fn of_service(slice: &EndpointSlice, svc: &Service) -> bool {
    slice.metadata.namespace == svc.metadata.namespace
        && svc.metadata.name.as_ref().is_some_and(|n| {
            slice
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(SERVICE_NAME_LABEL))
                == Some(n)
        })
}

/// The conditions kube-proxy reads, with the API's defaults for absent ones.
struct Conditions {
    ready: bool,
    serving: bool,
    terminating: bool,
}

fn conditions(ep: &Endpoint) -> Conditions {
    let c = ep.conditions.as_ref();
    Conditions {
        ready: c.and_then(|c| c.ready).unwrap_or(true),
        serving: c.and_then(|c| c.serving).unwrap_or(true),
        terminating: c.and_then(|c| c.terminating).unwrap_or(false),
    }
}

/// The backends of one frontend: `family` is the frontend's address type, `port` the Service
/// port it is.
fn backends(
    port: &ServicePort,
    proto: LbProto,
    family: &str,
    slices: &[&EndpointSlice],
    local_node: Option<&str>,
) -> Vec<Backend> {
    let name = port.name.as_deref().unwrap_or_default();
    // (endpoint, its target port) of every slice of the family that serves this port.
    let candidates: Vec<(&Endpoint, u16)> = slices
        .iter()
        .filter(|s| s.address_type == family)
        .filter_map(|s| {
            let p = s.ports.as_ref()?.iter().find(|p| {
                p.name.as_deref().unwrap_or_default() == name
                    && self::proto(p.protocol.as_deref()) == Some(proto)
            })?;
            let n = u16::try_from(p.port?).ok().filter(|n| *n != 0)?;
            Some(s.endpoints.iter().map(move |e| (e, n)))
        })
        .flatten()
        .filter(|(e, _)| local_node.is_none_or(|n| e.node_name.as_deref() == Some(n)))
        .collect();
    let ready: Vec<(&Endpoint, u16)> = candidates
        .iter()
        .copied()
        .filter(|(e, _)| conditions(e).ready)
        .collect();
    let chosen = if ready.is_empty() {
        candidates
            .into_iter()
            .filter(|(e, _)| {
                let c = conditions(e);
                c.serving && c.terminating
            })
            .collect()
    } else {
        ready
    };
    let set: BTreeSet<Backend> = chosen
        .into_iter()
        .flat_map(|(e, port)| {
            e.addresses
                .iter()
                .filter_map(|a| a.parse::<IpAddr>().ok())
                .filter(|a| address_type(*a) == family)
                .map(move |addr| Backend { addr, port })
        })
        .collect();
    set.into_iter().collect()
}

/// The frontends of `svc` with their backends from `slices` (any slices: those of other
/// Services are skipped), for a proxy on node `node`. In the order of `spec.clusterIPs`, then
/// of `spec.ports`.
#[must_use]
pub fn frontends(svc: &Service, slices: &[&EndpointSlice], node: &str) -> Frontends {
    let Some(spec) = &svc.spec else {
        return Vec::new();
    };
    let mine: Vec<&EndpointSlice> = slices
        .iter()
        .copied()
        .filter(|s| of_service(s, svc))
        .collect();
    let local = (spec.internal_traffic_policy.as_deref() == Some("Local")).then_some(node);
    let mut out = Vec::new();
    for addr in cluster_ips(svc) {
        for p in spec.ports.iter().flatten() {
            let (Some(proto), Ok(port)) = (proto(p.protocol.as_deref()), u16::try_from(p.port))
            else {
                tracing::warn!(
                    service = ?svc.metadata.name,
                    "port {} protocol {:?} cannot be translated: skipped",
                    p.port,
                    p.protocol
                );
                continue;
            };
            let f = Frontend { addr, port, proto };
            out.push((f, backends(p, proto, address_type(addr), &mine, local)));
        }
    }
    out
}

/// `namespace/name` of an object.
#[must_use]
pub fn key(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Option<String> {
    Some(format!(
        "{}/{}",
        meta.namespace.as_deref()?,
        meta.name.as_deref()?
    ))
}

/// `namespace/name` of the Service a slice belongs to.
fn owner(slice: &EndpointSlice) -> Option<String> {
    Some(format!(
        "{}/{}",
        slice.metadata.namespace.as_deref()?,
        slice.metadata.labels.as_ref()?.get(SERVICE_NAME_LABEL)?
    ))
}

/// What to tell the manager about one Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// `namespace/name` has these frontends now (at least one).
    Apply(String, Frontends),
    /// `namespace/name` has no frontends (gone, headless, `ExternalName`...).
    Delete(String),
}

/// The cluster's Services and `EndpointSlices`, and what was last delivered per Service.
/// Nothing is delivered until both kinds have been listed once, so a restart does not replace
/// the manager's backends with the empty ones of a Service whose slices are not listed yet.
#[derive(Default)]
pub struct ServiceTable {
    services: BTreeMap<String, Service>,
    /// `(service key, slice name)` → slice.
    slices: BTreeMap<(String, String), EndpointSlice>,
    /// Slice `namespace/name` → its service key.
    slice_owner: BTreeMap<String, String>,
    delivered: BTreeMap<String, Frontends>,
    services_listed: bool,
    slices_listed: bool,
}

/// Drops what translation never reads and a cluster-wide cache should not hold.
fn slim(meta: &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) {
    meta.managed_fields = None;
    meta.annotations = None;
}

impl ServiceTable {
    /// Whether both kinds have been listed: changes are delivered from then on.
    #[must_use]
    pub fn live(&self) -> bool {
        self.services_listed && self.slices_listed
    }

    /// What `key`'s translation became, if it differs from what was delivered.
    fn recompute(&mut self, key: &str, node: &str) -> Option<Change> {
        if !self.live() {
            return None;
        }
        let now = self.services.get(key).map_or_else(Vec::new, |svc| {
            let slices: Vec<&EndpointSlice> = self
                .slices
                .range((key.to_owned(), String::new())..)
                .take_while(|((k, _), _)| k == key)
                .map(|(_, s)| s)
                .collect();
            frontends(svc, &slices, node)
        });
        if now.is_empty() {
            self.delivered
                .remove(key)
                .map(|_| Change::Delete(key.to_owned()))
        } else if self.delivered.get(key) == Some(&now) {
            None
        } else {
            self.delivered.insert(key.to_owned(), now.clone());
            Some(Change::Apply(key.to_owned(), now))
        }
    }

    /// A Service arrived or changed.
    pub fn put_service(&mut self, mut svc: Service, node: &str) -> Option<Change> {
        let key = key(&svc.metadata)?;
        slim(&mut svc.metadata);
        self.services.insert(key.clone(), svc);
        self.recompute(&key, node)
    }

    /// A Service is gone.
    pub fn remove_service(&mut self, svc: &Service, node: &str) -> Option<Change> {
        let key = key(&svc.metadata)?;
        self.services.remove(&key);
        self.recompute(&key, node)
    }

    /// An `EndpointSlice` arrived or changed: the Services it belonged to and belongs to now.
    pub fn put_slice(&mut self, mut slice: EndpointSlice, node: &str) -> Vec<Change> {
        let Some(id) = key(&slice.metadata) else {
            return Vec::new();
        };
        slim(&mut slice.metadata);
        let mut touched: Vec<String> = self.take_slice(&id).into_iter().collect();
        if let (Some(svc), Some(name)) = (owner(&slice), slice.metadata.name.clone()) {
            self.slice_owner.insert(id, svc.clone());
            self.slices.insert((svc.clone(), name), slice);
            if !touched.contains(&svc) {
                touched.push(svc);
            }
        }
        touched
            .iter()
            .filter_map(|k| self.recompute(k, node))
            .collect()
    }

    /// An `EndpointSlice` is gone.
    pub fn remove_slice(&mut self, slice: &EndpointSlice, node: &str) -> Option<Change> {
        let id = key(&slice.metadata)?;
        let svc = self.take_slice(&id)?;
        self.recompute(&svc, node)
    }

    /// Forgets slice `id` (`namespace/name`); returns the Service it belonged to.
    fn take_slice(&mut self, id: &str) -> Option<String> {
        let svc = self.slice_owner.remove(id)?;
        let name = id.split_once('/').map_or(id, |(_, n)| n);
        self.slices.remove(&(svc.clone(), name.to_owned()));
        Some(svc)
    }

    /// After a (re-)list of Services (`listed`: their keys): those not listed are forgotten.
    /// Once both kinds are listed, every Service is recomputed and each of `known` (what the
    /// manager has, also from before a restart) without frontends now is deleted.
    pub fn services_relisted(
        &mut self,
        listed: &BTreeSet<String>,
        node: &str,
        known: impl FnOnce() -> Vec<String>,
    ) -> Vec<Change> {
        self.services.retain(|k, _| listed.contains(k));
        self.services_listed = true;
        self.resync(node, known)
    }

    /// After a (re-)list of `EndpointSlices` (`listed`: their `namespace/name`): like
    /// [`Self::services_relisted`].
    pub fn slices_relisted(
        &mut self,
        listed: &BTreeSet<String>,
        node: &str,
        known: impl FnOnce() -> Vec<String>,
    ) -> Vec<Change> {
        let gone: Vec<String> = self
            .slice_owner
            .keys()
            .filter(|id| !listed.contains(*id))
            .cloned()
            .collect();
        for id in gone {
            self.take_slice(&id);
        }
        self.slices_listed = true;
        self.resync(node, known)
    }

    fn resync(&mut self, node: &str, known: impl FnOnce() -> Vec<String>) -> Vec<Change> {
        if !self.live() {
            return Vec::new();
        }
        let mut keys: BTreeSet<String> = self.services.keys().cloned().collect();
        keys.extend(self.delivered.keys().cloned());
        let mut out: Vec<Change> = keys
            .iter()
            .filter_map(|k| self.recompute(k, node))
            .collect();
        for name in known() {
            if !self.delivered.contains_key(&name) && !out.contains(&Change::Delete(name.clone())) {
                out.push(Change::Delete(name));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdata;
    use serde_json::Value;

    /// Deserialises `v` as `T`, failing on any field `T` does not have (a typo in the
    /// testdata would otherwise be dropped silently).
    fn strict<T: serde::de::DeserializeOwned>(v: Value) -> T {
        let mut unknown = Vec::new();
        let t = serde_ignored::deserialize(v, |p| unknown.push(p.to_string())).unwrap();
        assert!(unknown.is_empty(), "unknown fields: {unknown:?}");
        t
    }

    /// testdata/k8s/services.json: `kubectl get services,endpointslices -o json` of the
    /// namespaces prod and staging.
    fn cluster() -> (Vec<Value>, Vec<EndpointSlice>) {
        let list = testdata::json("services.json");
        let items = list["items"].as_array().unwrap();
        let of = |kind: &'static str| items.iter().filter(move |i| i["kind"] == kind).cloned();
        (
            of("Service").collect(),
            of("EndpointSlice").map(strict).collect(),
        )
    }

    fn service(name: &str) -> Value {
        cluster()
            .0
            .into_iter()
            .find(|s| s["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no service {name}"))
    }

    fn translate_with(svc: Value, slices: &[EndpointSlice], node: &str) -> Vec<String> {
        let svc: Service = strict(svc);
        let refs: Vec<&EndpointSlice> = slices.iter().collect();
        frontends(&svc, &refs, node)
            .into_iter()
            .map(|(f, b)| {
                let b: Vec<String> = b
                    .iter()
                    .map(|b| std::net::SocketAddr::new(b.addr, b.port).to_string())
                    .collect();
                format!("{:?} {} {} -> {}", f.proto, f.addr, f.port, b.join(" "))
            })
            .collect()
    }

    fn translate(svc: Value, node: &str) -> Vec<String> {
        translate_with(svc, &cluster().1, node)
    }

    #[test]
    fn two_named_ports_get_their_ready_backends_from_every_slice() {
        // 10.0.16.6 is not ready; 10.0.17.9 has no conditions (ready); 10.0.16.5 is in both
        // slices; the slice of staging/web and that of prod/api are not prod/web's. The second
        // port's targetPort is a name: the slice says which number.
        assert_eq!(
            translate(service("web"), "worker-1"),
            [
                "Tcp 10.96.0.10 80 -> 10.0.16.5:8080 10.0.17.8:8080 10.0.17.9:8080",
                "Tcp 10.96.0.10 9090 -> 10.0.16.5:9102 10.0.17.8:9102 10.0.17.9:9102",
            ]
        );
        assert_eq!(
            translate(service("api"), "worker-1"),
            ["Tcp 10.96.0.11 80 -> 10.0.16.20:8080"]
        );
    }

    #[test]
    fn a_port_the_slices_lack_has_no_backends() {
        let mut svc = service("web");
        svc["spec"]["ports"][0]["name"] = "https".into();
        svc["spec"]["ports"][1]["protocol"] = "UDP".into();
        assert_eq!(
            translate(svc, "worker-1"),
            ["Tcp 10.96.0.10 80 -> ", "Udp 10.96.0.10 9090 -> "]
        );
        let (_, mut slices) = cluster();
        for s in &mut slices {
            for p in s.ports.iter_mut().flatten() {
                p.port = None;
            }
        }
        assert_eq!(
            translate_with(service("api"), &slices, "worker-1"),
            ["Tcp 10.96.0.11 80 -> "]
        );
    }

    #[test]
    fn headless_external_name_and_other_proxies_have_no_frontends() {
        assert!(translate(service("db"), "worker-1").is_empty());
        assert!(translate(service("search"), "worker-1").is_empty());
        // Not even with a clusterIP left over from before a type change.
        let mut svc = service("search");
        svc["spec"]["clusterIP"] = "10.96.0.14".into();
        svc["spec"]["ports"] = serde_json::json!([{"port": 443, "protocol": "TCP"}]);
        assert!(translate(svc, "worker-1").is_empty());
        let mut svc = service("api");
        svc["metadata"]["labels"][SERVICE_PROXY_NAME_LABEL] = "other".into();
        assert!(translate(svc, "worker-1").is_empty());
        // An empty clusterIP (not allocated) is no frontend either.
        let mut svc = service("api");
        svc["spec"]["clusterIP"] = "".into();
        svc["spec"]["clusterIPs"] = Value::Array(Vec::new());
        assert!(translate(svc, "worker-1").is_empty());
    }

    #[test]
    fn cluster_ip_is_the_fallback_for_a_missing_cluster_ips() {
        let mut svc = service("api");
        svc["spec"].as_object_mut().unwrap().remove("clusterIPs");
        assert_eq!(
            translate(svc, "worker-1"),
            ["Tcp 10.96.0.11 80 -> 10.0.16.20:8080"]
        );
    }

    #[test]
    fn dual_stack_has_a_frontend_per_family_with_that_familys_slices() {
        assert_eq!(
            translate(service("dns"), "worker-1"),
            [
                "Udp 10.96.0.53 53 -> 10.0.16.40:5353",
                "Tcp 10.96.0.53 53 -> 10.0.16.40:5353",
                "Udp fd00:10:96::35 53 -> [fd00:10:16::28]:5353",
                "Tcp fd00:10:96::35 53 -> [fd00:10:16::28]:5353",
            ]
        );
        // An address of the other family in a slice (the API server refuses it) is skipped.
        let (_, mut slices) = cluster();
        let v4 = slices
            .iter_mut()
            .find(|s| s.metadata.name.as_deref() == Some("dns-v4n8c"))
            .unwrap();
        v4.endpoints[0].addresses.push("fd00:10:16::29".into());
        assert_eq!(
            translate_with(service("dns"), &slices, "worker-1")[..2],
            [
                "Udp 10.96.0.53 53 -> 10.0.16.40:5353",
                "Tcp 10.96.0.53 53 -> 10.0.16.40:5353",
            ]
        );
    }

    #[test]
    fn with_no_ready_endpoint_the_serving_terminating_ones_take_over() {
        // The port is unnamed in the Service and "" in the slice: the same.
        assert_eq!(
            translate(service("cache"), "worker-1"),
            ["Tcp 10.96.0.12 6379 -> 10.0.16.50:6379"]
        );
        // Once one is ready, only it.
        let (_, mut slices) = cluster();
        let cache = slices
            .iter_mut()
            .find(|s| s.metadata.name.as_deref() == Some("cache-8zm4v"))
            .unwrap();
        cache.endpoints[2].conditions = None;
        assert_eq!(
            translate_with(service("cache"), &slices, "worker-1"),
            ["Tcp 10.96.0.12 6379 -> 10.0.17.52:6379"]
        );
    }

    #[test]
    fn internal_traffic_policy_local_keeps_this_nodes_endpoints() {
        let mut svc = service("web");
        svc["spec"]["internalTrafficPolicy"] = "Local".into();
        assert_eq!(
            translate(svc.clone(), "worker-2"),
            [
                "Tcp 10.96.0.10 80 -> 10.0.17.8:8080 10.0.17.9:8080",
                "Tcp 10.96.0.10 9090 -> 10.0.17.8:9102 10.0.17.9:9102",
            ]
        );
        assert_eq!(
            translate(svc.clone(), "worker-1"),
            [
                "Tcp 10.96.0.10 80 -> 10.0.16.5:8080",
                "Tcp 10.96.0.10 9090 -> 10.0.16.5:9102",
            ]
        );
        assert_eq!(
            translate(svc, "worker-3"),
            ["Tcp 10.96.0.10 80 -> ", "Tcp 10.96.0.10 9090 -> "]
        );
    }

    #[test]
    fn load_balancer_and_external_ips_get_only_their_cluster_ip() {
        assert_eq!(
            translate(service("shop"), "worker-1"),
            ["Tcp 10.96.0.13 443 -> 10.0.17.60:8443"]
        );
    }

    fn names(changes: &[Change]) -> Vec<String> {
        changes
            .iter()
            .map(|c| match c {
                Change::Apply(k, f) => format!("apply {k} {}", f.len()),
                Change::Delete(k) => format!("delete {k}"),
            })
            .collect()
    }

    /// A table after both lists; the manager knew prod/web and prod/gone before.
    fn listed() -> (ServiceTable, Vec<Change>) {
        let (svcs, slices) = cluster();
        let mut t = ServiceTable::default();
        let mut changes = Vec::new();
        let mut svc_keys = BTreeSet::new();
        for s in svcs {
            let s: Service = strict(s);
            svc_keys.insert(key(&s.metadata).unwrap());
            changes.extend(t.put_service(s, "worker-1"));
        }
        changes.extend(t.services_relisted(&svc_keys, "worker-1", Vec::new));
        let mut slice_keys = BTreeSet::new();
        for s in slices {
            slice_keys.insert(key(&s.metadata).unwrap());
            changes.extend(t.put_slice(s, "worker-1"));
        }
        assert!(changes.is_empty(), "nothing before both are listed");
        let known = || vec!["prod/web".to_owned(), "prod/gone".to_owned()];
        let changes = t.slices_relisted(&slice_keys, "worker-1", known);
        (t, changes)
    }

    #[test]
    fn both_lists_deliver_every_service_and_delete_what_the_manager_has_extra() {
        let (_, changes) = listed();
        assert_eq!(
            names(&changes),
            [
                "apply prod/api 1",
                "apply prod/cache 1",
                "apply prod/dns 4",
                "apply prod/shop 1",
                "apply prod/web 2",
                "delete prod/gone",
            ]
        );
    }

    fn slice(name: &str) -> EndpointSlice {
        cluster()
            .1
            .into_iter()
            .find(|s| s.metadata.name.as_deref() == Some(name))
            .unwrap()
    }

    #[test]
    fn a_slice_change_recomputes_its_service_only_when_it_changes_something() {
        let (mut t, _) = listed();
        let mut s = slice("web-7xk2p");
        // Unchanged: nothing to say.
        assert!(t.put_slice(s.clone(), "worker-1").is_empty());
        // 10.0.16.6 becomes ready.
        s.endpoints[2].conditions = None;
        let c = t.put_slice(s.clone(), "worker-1");
        assert_eq!(names(&c), ["apply prod/web 2"]);
        let Change::Apply(_, f) = &c[0] else {
            unreachable!()
        };
        assert_eq!(f[0].1.len(), 4, "{f:?}");
        // Moved to another Service: both are recomputed.
        s.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(SERVICE_NAME_LABEL.into(), "api".into());
        let c = t.put_slice(s.clone(), "worker-1");
        assert_eq!(names(&c), ["apply prod/web 2", "apply prod/api 1"]);
        // Deleted: its (new) Service loses the backends.
        assert_eq!(
            names(
                &t.remove_slice(&s, "worker-1")
                    .into_iter()
                    .collect::<Vec<_>>()
            ),
            ["apply prod/api 1"]
        );
    }

    #[test]
    fn a_service_without_frontends_is_delivered_as_a_delete() {
        let (mut t, _) = listed();
        let mut svc: Service = strict(service("api"));
        svc.spec.as_mut().unwrap().type_ = Some("ExternalName".into());
        assert_eq!(
            t.put_service(svc.clone(), "worker-1"),
            Some(Change::Delete("prod/api".into()))
        );
        // Deleting it now says nothing more: it was delivered as deleted.
        assert_eq!(t.remove_service(&svc, "worker-1"), None);
        let web: Service = strict(service("web"));
        assert_eq!(
            t.remove_service(&web, "worker-1"),
            Some(Change::Delete("prod/web".into()))
        );
    }

    #[test]
    fn a_relist_forgets_what_it_no_longer_has() {
        let (mut t, _) = listed();
        let slices: BTreeSet<String> = ["prod/web-q9vfz".to_owned()].into();
        let c = t.slices_relisted(&slices, "worker-1", || vec!["prod/web".into()]);
        // web keeps the backends of its one listed slice; the others' services have none.
        assert_eq!(
            names(&c),
            [
                "apply prod/api 1",
                "apply prod/cache 1",
                "apply prod/dns 4",
                "apply prod/shop 1",
                "apply prod/web 2",
            ]
        );
        let services: BTreeSet<String> = ["prod/web".to_owned()].into();
        let c = t.services_relisted(&services, "worker-1", || {
            vec!["prod/web".into(), "prod/api".into()]
        });
        assert_eq!(
            names(&c),
            [
                "delete prod/api",
                "delete prod/cache",
                "delete prod/dns",
                "delete prod/shop"
            ]
        );
    }
}
