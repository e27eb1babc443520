//! [`Api`] over the API server (kube-rs). The client lives on a small runtime of its own, so
//! the manager's blocking callers (the CNI ADD path, the agent's threads) wait on a channel
//! without nesting runtimes; every call waits at most `timeout`. Objects are handled as
//! `DynamicObject`s of the CRDs in conf/k8s/00-crd-weft.yaml; Nodes as typed objects.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};
use weft_k8s::k8s_openapi::api::core::v1::Node;
use weft_k8s::kube::api::{
    Api as KApi, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams,
    Preconditions,
};
use weft_k8s::kube::runtime::{WatchStreamExt, watcher};
use weft_k8s::kube::{Client, Error as KubeError};

use super::{
    Api, CLAIMED_ANNOTATION, Change, CrdError, EndpointObject, GROUP, HASH_LABEL, IdentityObject,
    KeyObject, Kind, Meta, Object, VERSION, labels_hash,
};
use crate::kvstore::keys::NodeRecord;
use weft_policy::labels::LabelSet;
use weft_policy::mapstate::Identity;

/// The field manager of Weft's server-side applies.
const MANAGER: &str = "weft-manager";

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: GROUP.into(),
        version: VERSION.into(),
        api_version: format!("{GROUP}/{VERSION}"),
        kind: kind.into(),
        plural: plural.into(),
    }
}

fn identity_resource() -> ApiResource {
    resource("WeftIdentity", "weftidentities")
}

fn key_resource() -> ApiResource {
    resource("WeftIdentityKey", "weftidentitykeys")
}

fn endpoint_resource() -> ApiResource {
    resource("WeftEndpoint", "weftendpoints")
}

fn malformed(what: String, detail: impl std::fmt::Display) -> CrdError {
    CrdError::Malformed {
        what,
        detail: detail.to_string(),
    }
}

fn meta_of(o: &DynamicObject) -> Meta {
    Meta {
        uid: o.metadata.uid.clone().unwrap_or_default(),
        resource_version: o.metadata.resource_version.clone().unwrap_or_default(),
    }
}

fn labels_of(what: &str, spec: &Value) -> Result<LabelSet, CrdError> {
    serde_json::from_value(spec["labels"].clone()).map_err(|e| malformed(what.into(), e))
}

/// A `WeftIdentity` as Weft reads it.
pub fn identity_of(o: &DynamicObject) -> Result<IdentityObject, CrdError> {
    let name = o.metadata.name.clone().unwrap_or_default();
    let what = format!("WeftIdentity {name}");
    let number = name
        .parse()
        .map_err(|_| malformed(what.clone(), "the name is not an identity number"))?;
    Ok(IdentityObject {
        number,
        labels: labels_of(&what, spec_of(o))?,
        meta: meta_of(o),
    })
}

/// An object's `spec` (`null` when it has none).
fn spec_of(o: &DynamicObject) -> &Value {
    o.data.get("spec").unwrap_or(&Value::Null)
}

/// A `WeftIdentityKey` as Weft reads it.
pub fn key_of(o: &DynamicObject) -> Result<KeyObject, CrdError> {
    let hash = o.metadata.name.clone().unwrap_or_default();
    let what = format!("WeftIdentityKey {hash}");
    let spec = spec_of(o);
    let number = spec["identity"]
        .as_u64()
        .and_then(|n| Identity::try_from(n).ok())
        .ok_or_else(|| malformed(what.clone(), "spec.identity is not an identity number"))?;
    Ok(KeyObject {
        hash,
        number,
        labels: labels_of(&what, spec)?,
        meta: meta_of(o),
    })
}

fn field<T: serde::de::DeserializeOwned>(what: &str, spec: &Value, f: &str) -> Result<T, CrdError> {
    serde_json::from_value(spec[f].clone()).map_err(|e| malformed(format!("{what} spec.{f}"), e))
}

/// A `WeftEndpoint` as Weft reads it.
pub fn endpoint_of(o: &DynamicObject) -> Result<EndpointObject, CrdError> {
    let namespace = o.metadata.namespace.clone().unwrap_or_default();
    let name = o.metadata.name.clone().unwrap_or_default();
    let what = format!("WeftEndpoint {namespace}/{name}");
    let spec = spec_of(o);
    let pod_uid = o
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|r| r.kind == "Pod")
        .map(|r| r.uid.clone())
        .unwrap_or_default();
    Ok(EndpointObject {
        pod_uid,
        node: field(&what, spec, "node")?,
        node_ip: field(&what, spec, "nodeIP")?,
        ips: field(&what, spec, "ips")?,
        identity: field(&what, spec, "identity")?,
        named_ports: if spec["namedPorts"].is_null() {
            Vec::new()
        } else {
            field(&what, spec, "namedPorts")?
        },
        namespace,
        name,
    })
}

/// The `WeftEndpoint` manifest of `ep`, owned by its Pod.
#[must_use]
pub fn endpoint_manifest(ep: &EndpointObject) -> Value {
    json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": "WeftEndpoint",
        "metadata": {
            "name": ep.name,
            "namespace": ep.namespace,
            "labels": { "weft.io/node": ep.node },
            "ownerReferences": [{
                "apiVersion": "v1",
                "kind": "Pod",
                "name": ep.name,
                "uid": ep.pod_uid,
            }],
        },
        "spec": {
            "node": ep.node,
            "nodeIP": ep.node_ip,
            "ips": ep.ips,
            "identity": ep.identity,
            "namedPorts": ep.named_ports,
        },
    })
}

/// A Node as Weft routes to it: its first `InternalIP`, the pod CIDRs its Weft annotated
/// (else `spec.podCIDRs`), and its router IPs. `None` without an `InternalIP`.
#[must_use]
pub fn node_record(node: &Node) -> Option<NodeRecord> {
    let name = node.metadata.name.clone()?;
    let node_ip: IpAddr = node
        .status
        .as_ref()?
        .addresses
        .iter()
        .flatten()
        .filter(|a| a.type_ == "InternalIP")
        .find_map(|a| a.address.parse().ok())?;
    let empty = BTreeMap::new();
    let ann = node.metadata.annotations.as_ref().unwrap_or(&empty);
    let from_ann = |what: &str| -> Vec<String> {
        ["ipv4", "ipv6"]
            .iter()
            .filter_map(|fam| ann.get(&format!("network.weft.io/{fam}-{what}")).cloned())
            .collect()
    };
    let mut cidrs = from_ann("pod-cidr");
    if cidrs.is_empty() {
        let spec = node.spec.as_ref();
        cidrs = spec
            .and_then(|s| s.pod_cidrs.clone())
            .or_else(|| spec.and_then(|s| s.pod_cidr.clone()).map(|c| vec![c]))
            .unwrap_or_default();
    }
    Some(NodeRecord {
        name,
        node_ip,
        pod_cidrs: cidrs.iter().filter_map(|c| c.parse().ok()).collect(),
        router_ips: from_ann("router-ip")
            .iter()
            .filter_map(|c| c.parse().ok())
            .collect(),
    })
}

/// The API server.
pub struct KubeApi {
    rt: tokio::runtime::Runtime,
    kubeconfig: Option<std::path::PathBuf>,
    client: Arc<Mutex<Option<Client>>>,
    timeout: Duration,
}

impl KubeApi {
    /// An API for `kubeconfig` (`None`: in-cluster, then `$KUBECONFIG`). Does not connect
    /// yet: the first call does.
    pub fn new(kubeconfig: Option<std::path::PathBuf>, timeout: Duration) -> std::io::Result<Self> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("weft-crd")
            .enable_all()
            .build()?;
        Ok(Self {
            rt,
            kubeconfig,
            client: Arc::new(Mutex::new(None)),
            timeout,
        })
    }

    /// Runs `f` with a client on the API's runtime and waits for it, bounded.
    fn run<T, F, Fut>(&self, f: F) -> Result<T, CrdError>
    where
        T: Send + 'static,
        F: FnOnce(Client) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, CrdError>> + Send,
    {
        let (tx, rx) = channel();
        let client = connect(self.client.clone(), self.kubeconfig.clone());
        let timeout = self.timeout;
        self.rt.spawn(async move {
            let work = async { f(client.await?).await };
            let result = tokio::time::timeout(timeout, work)
                .await
                .unwrap_or_else(|_| {
                    Err(CrdError::Unavailable(format!(
                        "no answer within {timeout:?}"
                    )))
                });
            let _ = tx.send(result);
        });
        rx.recv_timeout(timeout + Duration::from_secs(1))
            .unwrap_or_else(|_| Err(CrdError::Unavailable("the client did not answer".into())))
    }
}

fn api_err(what: String) -> impl FnOnce(KubeError) -> CrdError {
    move |source| CrdError::Api { what, source }
}

fn is_status(e: &KubeError, code: u16) -> bool {
    matches!(e, KubeError::Api(s) if s.code == code)
}

/// Creates `obj`; `false` on 409 `AlreadyExists`.
async fn create(
    api: KApi<DynamicObject>,
    obj: DynamicObject,
    what: String,
) -> Result<bool, CrdError> {
    match api.create(&PostParams::default(), &obj).await {
        Ok(_) => Ok(true),
        Err(e) if is_status(&e, 409) => Ok(false),
        Err(e) => Err(api_err(what)(e)),
    }
}

/// GETs `name`; `None` on 404.
async fn get(
    api: KApi<DynamicObject>,
    name: String,
    what: String,
) -> Result<Option<DynamicObject>, CrdError> {
    api.get_opt(&name).await.map_err(api_err(what))
}

/// Deletes exactly version `meta` of `name`; `false` on 404 or 409 (precondition failed).
async fn delete(
    api: KApi<DynamicObject>,
    name: String,
    meta: Meta,
    what: String,
) -> Result<bool, CrdError> {
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(meta.uid),
            resource_version: Some(meta.resource_version),
        }),
        ..DeleteParams::default()
    };
    match api.delete(&name, &dp).await {
        Ok(_) => Ok(true),
        Err(e) if is_status(&e, 404) || is_status(&e, 409) => Ok(false),
        Err(e) => Err(api_err(what)(e)),
    }
}

impl Api for KubeApi {
    fn list_identities(&self) -> Result<Vec<IdentityObject>, CrdError> {
        self.run(|c| async move {
            let api = KApi::<DynamicObject>::all_with(c, &identity_resource());
            let list = api
                .list(&weft_k8s::kube::api::ListParams::default())
                .await
                .map_err(api_err("list WeftIdentities".into()))?;
            // A malformed object still takes its number: count it as taken.
            Ok(list
                .items
                .iter()
                .filter_map(|o| match identity_of(o) {
                    Ok(i) => Some(i),
                    Err(e) => {
                        tracing::warn!("{e}");
                        None
                    }
                })
                .collect())
        })
    }

    fn get_identity(&self, number: Identity) -> Result<Option<IdentityObject>, CrdError> {
        self.run(move |c| async move {
            let api = KApi::<DynamicObject>::all_with(c, &identity_resource());
            let got = get(
                api,
                number.to_string(),
                format!("get WeftIdentity {number}"),
            )
            .await?;
            got.as_ref().map(identity_of).transpose()
        })
    }

    fn create_identity(&self, number: Identity, labels: &LabelSet) -> Result<bool, CrdError> {
        let obj = DynamicObject::new(&number.to_string(), &identity_resource()).data(json!({
            "spec": { "labels": labels }
        }));
        let mut obj = obj;
        obj.metadata.labels = Some(
            [(HASH_LABEL.to_owned(), labels_hash(labels))]
                .into_iter()
                .collect(),
        );
        self.run(move |c| async move {
            let api = KApi::<DynamicObject>::all_with(c, &identity_resource());
            create(api, obj, format!("create WeftIdentity {number}")).await
        })
    }

    fn delete_identity(&self, number: Identity, meta: &Meta) -> Result<bool, CrdError> {
        let meta = meta.clone();
        self.run(move |c| async move {
            let api = KApi::<DynamicObject>::all_with(c, &identity_resource());
            delete(
                api,
                number.to_string(),
                meta,
                format!("delete WeftIdentity {number}"),
            )
            .await
        })
    }

    fn get_key(&self, hash: &str) -> Result<Option<KeyObject>, CrdError> {
        let hash = hash.to_owned();
        self.run(move |c| async move {
            let api = KApi::<DynamicObject>::all_with(c, &key_resource());
            let what = format!("get WeftIdentityKey {hash}");
            let got = get(api, hash, what).await?;
            got.as_ref().map(key_of).transpose()
        })
    }

    fn create_key(&self, labels: &LabelSet, number: Identity) -> Result<bool, CrdError> {
        let hash = labels_hash(labels);
        let mut obj = DynamicObject::new(&hash, &key_resource()).data(json!({
            "spec": { "identity": number, "labels": labels }
        }));
        obj.metadata.labels = Some(
            [(HASH_LABEL.to_owned(), hash.clone())]
                .into_iter()
                .collect(),
        );
        self.run(move |c| async move {
            let api = KApi::<DynamicObject>::all_with(c, &key_resource());
            create(api, obj, format!("create WeftIdentityKey {hash}")).await
        })
    }

    fn touch_key(&self, hash: &str, node: &str) -> Result<bool, CrdError> {
        let hash = hash.to_owned();
        let stamp = format!("{node} {}", crate::sys::clock::now_ms());
        self.run(move |c| async move {
            let api = KApi::<DynamicObject>::all_with(c, &key_resource());
            let patch = json!({ "metadata": { "annotations": { CLAIMED_ANNOTATION: stamp } } });
            match api
                .patch(&hash, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => Ok(true),
                Err(e) if is_status(&e, 404) => Ok(false),
                Err(e) => Err(api_err(format!("claim WeftIdentityKey {hash}"))(e)),
            }
        })
    }

    fn delete_key(&self, hash: &str, meta: &Meta) -> Result<bool, CrdError> {
        let (hash, meta) = (hash.to_owned(), meta.clone());
        self.run(move |c| async move {
            let api = KApi::<DynamicObject>::all_with(c, &key_resource());
            let what = format!("delete WeftIdentityKey {hash}");
            delete(api, hash, meta, what).await
        })
    }

    fn apply_endpoint(&self, ep: &EndpointObject) -> Result<(), CrdError> {
        let manifest = endpoint_manifest(ep);
        let (ns, name) = (ep.namespace.clone(), ep.name.clone());
        self.run(move |c| async move {
            let api = KApi::<DynamicObject>::namespaced_with(c, &ns, &endpoint_resource());
            api.patch(
                &name,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&manifest),
            )
            .await
            .map(|_| ())
            .map_err(api_err(format!("apply WeftEndpoint {ns}/{name}")))
        })
    }

    fn delete_endpoint(&self, ep: &EndpointObject) -> Result<(), CrdError> {
        let ep = ep.clone();
        self.run(move |c| async move {
            let api =
                KApi::<DynamicObject>::namespaced_with(c, &ep.namespace, &endpoint_resource());
            let what = format!("delete WeftEndpoint {}/{}", ep.namespace, ep.name);
            let Some(cur) = get(api.clone(), ep.name.clone(), what.clone()).await? else {
                return Ok(());
            };
            // Only while it is still this pod's on this node.
            let ours =
                endpoint_of(&cur).is_ok_and(|c| c.node == ep.node && c.pod_uid == ep.pod_uid);
            if ours {
                let meta = meta_of(&cur);
                delete(api, ep.name.clone(), meta, what).await?;
            }
            Ok(())
        })
    }

    fn watch(&self) -> Result<Receiver<Change>, CrdError> {
        let (tx, rx) = channel();
        let cached = self.client.clone();
        let kubeconfig = self.kubeconfig.clone();
        self.rt.spawn(async move {
            let client = loop {
                match connect(cached.clone(), kubeconfig.clone()).await {
                    Ok(c) => break c,
                    Err(e) => {
                        if tx.send(Change::Broken(Kind::Node, e.to_string())).is_err() {
                            return;
                        }
                        tokio::time::sleep(Duration::from_secs(2)).await;
                    }
                }
            };
            let config = watcher::Config::default;
            let dynamic = |ar: &ApiResource| {
                watcher(
                    KApi::<DynamicObject>::all_with(client.clone(), ar),
                    config(),
                )
                .backoff(weft_k8s::watch::retry_backoff())
            };
            tokio::spawn(pump(
                dynamic(&identity_resource()),
                Kind::Identity,
                |o| logged(identity_of(o)).map(Object::Identity),
                tx.clone(),
            ));
            tokio::spawn(pump(
                dynamic(&key_resource()),
                Kind::Key,
                |o| logged(key_of(o)).map(Object::Key),
                tx.clone(),
            ));
            tokio::spawn(pump(
                dynamic(&endpoint_resource()),
                Kind::Endpoint,
                |o| logged(endpoint_of(o)).map(Object::Endpoint),
                tx.clone(),
            ));
            tokio::spawn(pump(
                watcher(KApi::<Node>::all(client.clone()), config())
                    .backoff(weft_k8s::watch::retry_backoff()),
                Kind::Node,
                |n| node_record(n).map(Object::Node),
                tx,
            ));
        });
        Ok(rx)
    }
}

async fn connect(
    cached: Arc<Mutex<Option<Client>>>,
    kubeconfig: Option<std::path::PathBuf>,
) -> Result<Client, CrdError> {
    let existing = crate::sys::locks::lock(&cached).clone();
    if let Some(c) = existing {
        return Ok(c);
    }
    let c = weft_k8s::client::client(kubeconfig.as_deref())
        .await
        .map_err(|e| CrdError::Unavailable(e.to_string()))?;
    *crate::sys::locks::lock(&cached) = Some(c.clone());
    Ok(c)
}

fn logged<T>(r: Result<T, CrdError>) -> Option<T> {
    r.map_err(|e| tracing::warn!("ignoring an object: {e}"))
        .ok()
}

/// Feeds one kind's watcher into `tx`: a (re)list is buffered until it is complete.
async fn pump<K, S>(stream: S, kind: Kind, convert: fn(&K) -> Option<Object>, tx: Sender<Change>)
where
    S: futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
{
    let mut stream = std::pin::pin!(stream);
    let mut buffer = Vec::new();
    while let Some(ev) = stream.next().await {
        let change = match ev {
            Ok(watcher::Event::Init) => {
                buffer.clear();
                continue;
            }
            Ok(watcher::Event::InitApply(o)) => {
                buffer.extend(convert(&o));
                continue;
            }
            Ok(watcher::Event::InitDone) => Change::Listed(kind, std::mem::take(&mut buffer)),
            Ok(watcher::Event::Apply(o)) => match convert(&o) {
                Some(x) => Change::Put(x),
                None => continue,
            },
            Ok(watcher::Event::Delete(o)) => match convert(&o) {
                Some(x) => Change::Deleted(x),
                None => continue,
            },
            Err(e) => Change::Broken(kind, e.to_string()),
        };
        if tx.send(change).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_becomes_a_record_from_its_internal_ip_and_cidrs() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/k8s/node.json");
        let mut node: Node = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let r = node_record(&node).unwrap();
        assert_eq!(r.name, "worker-1");
        assert_eq!(r.node_ip.to_string(), "172.18.0.3");
        assert_eq!(
            r.pod_cidrs.len(),
            2,
            "spec.podCIDRs without Weft's annotations"
        );
        assert!(r.router_ips.is_empty());
        let ann = node.metadata.annotations.get_or_insert_default();
        ann.insert("network.weft.io/ipv4-pod-cidr".into(), "10.9.0.0/24".into());
        ann.insert("network.weft.io/ipv4-router-ip".into(), "10.9.0.1".into());
        let r = node_record(&node).unwrap();
        assert_eq!(
            r.pod_cidrs,
            ["10.9.0.0/24".parse().unwrap()],
            "what its Weft chose"
        );
        assert_eq!(r.router_ips, ["10.9.0.1".parse::<IpAddr>().unwrap()]);
        node.status.as_mut().unwrap().addresses = Some(Vec::new());
        assert!(node_record(&node).is_none(), "no InternalIP: not routable");
    }

    #[test]
    fn objects_round_trip_through_their_manifests() {
        let ep = EndpointObject {
            namespace: "ns".into(),
            name: "web-1".into(),
            pod_uid: "u-1".into(),
            node: "n1".into(),
            node_ip: "192.0.2.1".parse().unwrap(),
            ips: vec!["10.1.0.5".parse().unwrap()],
            identity: 300,
            named_ports: vec![crate::kvstore::keys::NamedPortRecord {
                name: "http".into(),
                protocol: "TCP".into(),
                port: 80,
            }],
        };
        let o: DynamicObject = serde_json::from_value(endpoint_manifest(&ep)).unwrap();
        assert_eq!(endpoint_of(&o).unwrap(), ep);
        let labels = LabelSet::for_pod("default", [("app", "web")]);
        let k: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "weft.io/v1alpha1", "kind": "WeftIdentityKey",
            "metadata": {"name": labels_hash(&labels), "uid": "x", "resourceVersion": "7"},
            "spec": {"identity": 300, "labels": labels},
        }))
        .unwrap();
        let key = key_of(&k).unwrap();
        assert_eq!(
            (key.number, &key.labels, key.meta.resource_version.as_str()),
            (300, &labels, "7")
        );
        let bad: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "weft.io/v1alpha1", "kind": "WeftIdentity",
            "metadata": {"name": "web"}, "spec": {"labels": []},
        }))
        .unwrap();
        assert!(matches!(identity_of(&bad), Err(CrdError::Malformed { .. })));
    }
}
