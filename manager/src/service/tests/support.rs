//! Managers over the fakes and labelled pods for the unit tests of the service, the slots and
//! the metrics (one place, so a change of the allocate/register contract is made once).

use std::sync::Arc;
use weft_api::{AllocateRequest, Endpoint, Label, RegisterRequest};

use crate::datapath::FakeDatapath;
use crate::endpoint::Registry;
use crate::node::hostnet::FakeHostNet;
use crate::policy_state::PolicyState;
use crate::service::{Manager, from_api_labels};
use crate::store::Store;

/// A manager over the fakes with one IPv4 pool, 10.0.1.0/24, on a fresh store.
pub(crate) fn fake_manager(net: Arc<FakeHostNet>, dp: Arc<FakeDatapath>) -> Manager {
    fake_manager_on(&Store::temporary().expect("temporary store"), net, dp)
}

/// The same on `store`, restoring what it holds (a restart over the same state).
pub(crate) fn fake_manager_on(
    store: &Store,
    net: Arc<FakeHostNet>,
    dp: Arc<FakeDatapath>,
) -> Manager {
    fake_manager_with_grace(store, net, dp, 0)
}

/// The same with an identity grace period of `grace_ms` (`--identity-grace-period`).
pub(crate) fn fake_manager_with_grace(
    store: &Store,
    net: Arc<FakeHostNet>,
    dp: Arc<FakeDatapath>,
    grace_ms: u64,
) -> Manager {
    // A manager is a new process: its datapath knows no more than the kernel maps hold.
    dp.reopen();
    let cidr = crate::node::select(
        &crate::node::NodeManifest::default(),
        &["10.0.1.0/24".into()],
    )
    .expect("a valid CIDR")
    .cidrs();
    let reg = Registry::open(
        store.clone(),
        vec![crate::endpoint::ipam::Pool::new(cidr[0].cidr)],
    )
    .expect("registry");
    let labels: Vec<_> = reg.list().map(|ep| from_api_labels(&ep.labels)).collect();
    let (pol, _) = PolicyState::restore_with_grace(
        store.clone(),
        &labels,
        grace_ms,
        crate::sys::clock::now_ms(),
    )
    .expect("policy state");
    Manager::new("n".into(), cidr, reg, pol, net, dp)
}

/// An ADD of container `c` in namespace default labelled `id=app`.
pub(crate) fn pod_request(c: &str, app: &str) -> AllocateRequest {
    AllocateRequest {
        container_id: c.into(),
        ifname: "eth0".into(),
        netns: "/x".into(),
        pod_namespace: Some("default".into()),
        pod_name: Some(c.into()),
        labels: vec![Label {
            key: "id".into(),
            value: app.into(),
        }],
    }
}

/// The CNI's second call for an allocated endpoint (host ifindex 9 + id).
pub(crate) fn make_ready(m: &Manager, ep: &Endpoint) -> Endpoint {
    m.register(
        ep.id,
        &RegisterRequest {
            container_id: ep.container_id.clone(),
            host_ifname: ep.host_ifname.clone(),
            host_ifindex: 9 + ep.id,
            host_mac: weft_api::MacAddr::new([2, 0, 0, 0, 0, 1]),
            pod_mac: weft_api::MacAddr::new([2, 0, 0, 0, 0, 2]),
        },
    )
    .expect("register")
}

/// A ready pod `c` labelled `id=app`.
pub(crate) fn ready_pod(m: &Manager, c: &str, app: &str) -> Endpoint {
    let ep = m.allocate(&pod_request(c, app)).expect("allocate");
    make_ready(m, &ep)
}
