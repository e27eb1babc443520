//! The CRD protocol against the in-memory API server: races between nodes, a crash between
//! the two creates, an identity deleted while in use, a Node deleted, an outage and re-list.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::agent::{CrdCluster, CrdConfig};
use super::identities::{Collector, allocate};
use super::mem::MemApi;
use super::view::View;
use super::{Api, Change, CrdError, EndpointObject, IdentityObject, KeyObject, Meta, labels_hash};
use crate::cluster::agent::Agent;
use crate::cluster::session::{Desired, PodRecord};
use crate::cluster::watch::Remote;
use crate::kvstore::identities::ClusterIdentityError;
use crate::kvstore::keys::{IpRecord, NodeRecord};
use weft_policy::labels::LabelSet;
use weft_policy::mapstate::Identity;

fn l(app: &str) -> LabelSet {
    LabelSet::for_pod("default", [("app", app)])
}

type Hook = Box<dyn FnOnce() + Send>;

/// The fake with a hook run once before the next `create_key` / `create_identity`: the other
/// node's whole allocation squeezed between two steps of this one.
struct Hooked {
    inner: Arc<MemApi>,
    before_key: Mutex<Option<Hook>>,
    before_number: Mutex<Option<Hook>>,
}

impl Hooked {
    fn new(inner: Arc<MemApi>) -> Self {
        Self {
            inner,
            before_key: Mutex::new(None),
            before_number: Mutex::new(None),
        }
    }
}

impl Api for Hooked {
    fn list_identities(&self) -> Result<Vec<IdentityObject>, CrdError> {
        self.inner.list_identities()
    }
    fn get_identity(&self, n: Identity) -> Result<Option<IdentityObject>, CrdError> {
        self.inner.get_identity(n)
    }
    fn create_identity(&self, n: Identity, labels: &LabelSet) -> Result<bool, CrdError> {
        let hook = self.before_number.lock().unwrap().take();
        if let Some(h) = hook {
            h();
        }
        self.inner.create_identity(n, labels)
    }
    fn delete_identity(&self, n: Identity, meta: &Meta) -> Result<bool, CrdError> {
        self.inner.delete_identity(n, meta)
    }
    fn get_key(&self, hash: &str) -> Result<Option<KeyObject>, CrdError> {
        self.inner.get_key(hash)
    }
    fn create_key(&self, labels: &LabelSet, n: Identity) -> Result<bool, CrdError> {
        let hook = self.before_key.lock().unwrap().take();
        if let Some(h) = hook {
            h();
        }
        self.inner.create_key(labels, n)
    }
    fn touch_key(&self, hash: &str, node: &str) -> Result<bool, CrdError> {
        self.inner.touch_key(hash, node)
    }
    fn delete_key(&self, hash: &str, meta: &Meta) -> Result<bool, CrdError> {
        self.inner.delete_key(hash, meta)
    }
    fn apply_endpoint(&self, ep: &EndpointObject) -> Result<(), CrdError> {
        self.inner.apply_endpoint(ep)
    }
    fn delete_endpoint(&self, ep: &EndpointObject) -> Result<(), CrdError> {
        self.inner.delete_endpoint(ep)
    }
    fn watch(&self) -> Result<Receiver<Change>, CrdError> {
        self.inner.watch()
    }
}

#[derive(Default)]
struct Log(Mutex<Vec<String>>);

impl Log {
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
    fn push(&self, s: String) {
        self.0.lock().unwrap().push(s);
    }
}

impl Remote for Log {
    fn identity_put(&self, id: Identity, labels: LabelSet) {
        self.push(format!("id+ {id} {labels}"));
    }
    fn identity_deleted(&self, id: Identity) {
        self.push(format!("id- {id}"));
    }
    fn ip_put(&self, r: &IpRecord) {
        self.push(format!("ip+ {} {} {}", r.ip, r.identity, r.node));
    }
    fn ip_deleted(&self, r: &IpRecord) {
        self.push(format!("ip- {}", r.ip));
    }
    fn node_put(&self, r: &NodeRecord) {
        self.push(format!("node+ {}", r.name));
    }
    fn node_deleted(&self, r: &NodeRecord) {
        self.push(format!("node- {}", r.name));
    }
    fn listed(&self) {
        self.push("listed".into());
    }
}

fn node(name: &str, ip: &str, cidr: &str) -> NodeRecord {
    NodeRecord {
        name: name.into(),
        node_ip: ip.parse().unwrap(),
        pod_cidrs: vec![cidr.parse().unwrap()],
        router_ips: Vec::new(),
    }
}

/// A node's agent over `api` and its watch (not started: the test drives it).
fn agent(api: Arc<dyn Api>, me: &NodeRecord) -> (CrdCluster, Receiver<Change>) {
    let rx = api.watch().unwrap();
    let c = CrdCluster::new(
        api,
        CrdConfig {
            node: me.clone(),
            gc_interval: Duration::from_mins(1),
            gc_grace: Duration::from_mins(5),
        },
    );
    (c, rx)
}

/// Hands the agent every change queued so far.
fn drain(c: &CrdCluster, rx: &Receiver<Change>, log: &Log) {
    while let Ok(ch) = rx.try_recv() {
        c.handle(ch, log);
    }
}

fn pod(name: &str, ip: &str, identity: Identity) -> PodRecord {
    PodRecord {
        namespace: "default".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        ips: vec![ip.parse().unwrap()],
        identity,
        named_ports: Vec::new(),
    }
}

fn desired(refs: &[(LabelSet, Identity)], pods: Vec<PodRecord>) -> Desired {
    Desired {
        ips: Vec::new(),
        refs: refs.iter().cloned().collect(),
        pods,
        pods_listed: true,
    }
}

#[test]
fn two_nodes_racing_for_one_label_set_agree_on_one_number() {
    let mem = Arc::new(MemApi::new());
    let a = Hooked::new(mem.clone());
    // B allocates the same labels after A reserved 256 and before A claims the label set.
    let b_api = mem.clone();
    let b_got = Arc::new(Mutex::new(None));
    let b_out = b_got.clone();
    *a.before_key.lock().unwrap() = Some(Box::new(move || {
        *b_out.lock().unwrap() = Some(allocate(&*b_api, &l("web"), "b").unwrap());
    }));
    let got_a = allocate(&a, &l("web"), "a").unwrap();
    let got_b = b_got.lock().unwrap().unwrap();
    assert_eq!(
        (got_a, got_b),
        (257, 257),
        "B claimed first with 257; A gave 256 back"
    );
    assert_eq!(mem.identities(), BTreeMap::from([(257, l("web"))]));
    assert_eq!(mem.keys(), BTreeMap::from([(labels_hash(&l("web")), 257)]));

    // A race for the number: B takes 258 for other labels between A's listing and its create.
    let b_api = mem.clone();
    *a.before_number.lock().unwrap() = Some(Box::new(move || {
        assert_eq!(allocate(&*b_api, &l("db"), "b").unwrap(), 258);
    }));
    assert_eq!(
        allocate(&a, &l("api"), "a").unwrap(),
        259,
        "409 on 258: the next one"
    );
    assert_eq!(
        allocate(&*mem, &l("web"), "c").unwrap(),
        257,
        "a third node reads the key"
    );
}

#[test]
fn a_crash_between_the_two_creates_leaves_a_number_nobody_sees_and_the_collector_removes_it() {
    let mem = Arc::new(MemApi::new());
    let (c, rx) = agent(mem.clone(), &node("a", "192.0.2.1", "10.1.0.0/24"));
    let log = Log::default();
    // A node reserved 256 for web and died before claiming the label set.
    assert!(mem.create_identity(256, &l("web")).unwrap());
    let web = allocate(&*mem, &l("web"), "b").unwrap();
    assert_eq!(
        web, 257,
        "the reserved number is taken; web gets the next one"
    );
    drain(&c, &rx, &log);
    assert!(
        !log.take().iter().any(|e| e.starts_with("id+ 256")),
        "an unclaimed number is never delivered"
    );
    let mut gc = Collector::new(Duration::from_mins(5));
    let used = BTreeSet::from([web]);
    let view = view_of(&c);
    let t0 = Instant::now();
    assert_eq!(
        gc.run(&*mem, &view, &used, t0).unwrap(),
        0,
        "within the grace period"
    );
    assert_eq!(mem.identities().len(), 2);
    let later = t0 + Duration::from_secs(301);
    assert_eq!(gc.run(&*mem, &view, &used, later).unwrap(), 1);
    assert_eq!(mem.identities(), BTreeMap::from([(257, l("web"))]));
}

fn view_of(c: &CrdCluster) -> View {
    c.view_snapshot()
}

#[test]
fn unused_identities_are_collected_after_the_grace_period_but_not_one_claimed_meanwhile() {
    let mem = Arc::new(MemApi::new());
    let (c, rx) = agent(mem.clone(), &node("a", "192.0.2.1", "10.1.0.0/24"));
    let log = Log::default();
    let web = allocate(&*mem, &l("web"), "a").unwrap();
    let db = allocate(&*mem, &l("db"), "a").unwrap();
    drain(&c, &rx, &log);
    let mut gc = Collector::new(Duration::from_mins(5));
    let t0 = Instant::now();
    let stale = view_of(&c);
    assert_eq!(gc.run(&*mem, &stale, &BTreeSet::new(), t0).unwrap(), 0);
    // Another node starts using web after the collector read the view: its claim moves the
    // key's version, so the guarded delete fails.
    assert_eq!(allocate(&*mem, &l("web"), "b").unwrap(), web);
    let later = t0 + Duration::from_secs(301);
    assert_eq!(
        gc.run(&*mem, &stale, &BTreeSet::new(), later).unwrap(),
        2,
        "db's key and number; web's delete refused"
    );
    assert_eq!(mem.identities(), BTreeMap::from([(web, l("web"))]));
    assert!(!mem.identities().contains_key(&db));
}

#[test]
fn an_identity_deleted_while_in_use_is_recreated_with_its_number() {
    let mem = Arc::new(MemApi::new());
    let me = node("a", "192.0.2.1", "10.1.0.0/24");
    let (c, rx) = agent(mem.clone(), &me);
    let (other, orx) = agent(mem.clone(), &node("b", "192.0.2.2", "10.2.0.0/24"));
    mem.put_node(me.clone());
    let log = Log::default();
    let olog = Log::default();
    drain(&c, &rx, &log);
    let web = c.allocate_identity(&l("web")).unwrap();
    let want = desired(&[(l("web"), web)], vec![pod("web-1", "10.1.0.5", web)]);
    let (mut published, mut reported) = (BTreeMap::new(), BTreeSet::new());
    drain(&c, &rx, &log);
    c.publish(&want, &mut published, &mut reported).unwrap();
    drain(&other, &orx, &olog);
    assert!(olog.take().contains(&format!("id+ {web} {}", l("web"))));

    mem.delete_by_hand(web);
    drain(&c, &rx, &log);
    drain(&other, &orx, &olog);
    assert!(olog.take().contains(&format!("id- {web}")));
    c.publish(&want, &mut published, &mut reported).unwrap();
    assert_eq!(mem.identities(), BTreeMap::from([(web, l("web"))]));
    assert_eq!(mem.keys(), BTreeMap::from([(labels_hash(&l("web")), web)]));
    drain(&other, &orx, &olog);
    assert!(
        olog.take().contains(&format!("id+ {web} {}", l("web"))),
        "other nodes learn it again"
    );
    assert!(reported.is_empty());
}

#[test]
fn endpoints_are_published_updated_and_withdrawn_and_another_nodes_pod_of_the_same_name_stays() {
    let mem = Arc::new(MemApi::new());
    let (c, rx) = agent(mem.clone(), &node("a", "192.0.2.1", "10.1.0.0/24"));
    let log = Log::default();
    drain(&c, &rx, &log);
    let (mut published, mut reported) = (BTreeMap::new(), BTreeSet::new());
    c.publish(
        &desired(
            &[],
            vec![pod("web-1", "10.1.0.5", 300), pod("db-1", "10.1.0.6", 301)],
        ),
        &mut published,
        &mut reported,
    )
    .unwrap();
    assert_eq!(mem.endpoints().len(), 2);
    c.publish(
        &desired(&[], vec![pod("web-1", "10.1.0.5", 302)]),
        &mut published,
        &mut reported,
    )
    .unwrap();
    let eps = mem.endpoints();
    assert_eq!(eps.len(), 1);
    assert_eq!(
        (eps[0].name.as_str(), eps[0].identity, eps[0].node.as_str()),
        ("web-1", 302, "a")
    );
    // The pod was recreated on node b under the same name before a withdrew it.
    let mut moved = eps[0].clone();
    moved.node = "b".into();
    moved.pod_uid = "uid-new".into();
    mem.apply_endpoint(&moved).unwrap();
    c.publish(&desired(&[], Vec::new()), &mut published, &mut reported)
        .unwrap();
    assert_eq!(mem.endpoints(), [moved], "b's object is not a's to delete");
}

#[test]
fn a_deleted_node_takes_its_routes_and_its_pods_addresses() {
    let mem = Arc::new(MemApi::new());
    let (b, _brx) = agent(mem.clone(), &node("b", "192.0.2.2", "10.2.0.0/24"));
    let log = Log::default();
    mem.put_node(node("a", "192.0.2.1", "10.1.0.0/24"));
    mem.put_node(node("b", "192.0.2.2", "10.2.0.0/24"));
    let web = b.allocate_identity(&l("web")).unwrap();
    b.publish(
        &desired(&[(l("web"), web)], vec![pod("web-1", "10.2.0.5", web)]),
        &mut BTreeMap::new(),
        &mut BTreeSet::new(),
    )
    .unwrap();
    // a starts now: its first listing has it all.
    let (a, arx) = agent(mem.clone(), &node("a", "192.0.2.1", "10.1.0.0/24"));
    drain(&a, &arx, &log);
    assert_eq!(
        log.take(),
        [
            format!("id+ {web} {}", l("web")),
            "node+ b".into(),
            format!("ip+ 10.2.0.5 {web} b"),
            "listed".into()
        ],
        "identities and nodes before the addresses that need them"
    );
    assert_eq!((a.nodes().len(), a.remote_ip_count()), (1, 1));
    mem.delete_node("b");
    drain(&a, &arx, &log);
    assert_eq!(log.take(), ["ip- 10.2.0.5", "node- b"]);
    assert_eq!((a.nodes().len(), a.remote_ip_count()), (0, 0));
    assert_eq!(
        mem.endpoints().len(),
        1,
        "the pod's object goes with the pod, later"
    );
}

#[test]
fn an_outage_keeps_what_is_known_refuses_new_labels_retryably_and_converges_on_relist() {
    let mem = Arc::new(MemApi::new());
    let (a, arx) = agent(mem.clone(), &node("a", "192.0.2.1", "10.1.0.0/24"));
    let (b, _brx) = agent(mem.clone(), &node("b", "192.0.2.2", "10.2.0.0/24"));
    let log = Log::default();
    mem.put_node(node("b", "192.0.2.2", "10.2.0.0/24"));
    let web = b.allocate_identity(&l("web")).unwrap();
    let mut b_published = BTreeMap::new();
    b.publish(
        &desired(
            &[(l("web"), web)],
            vec![pod("web-1", "10.2.0.5", web), pod("web-2", "10.2.0.6", web)],
        ),
        &mut b_published,
        &mut BTreeSet::new(),
    )
    .unwrap();
    drain(&a, &arx, &log);
    assert!(a.synced() && a.connected());
    log.take();

    mem.set_down(true);
    drain(&a, &arx, &log);
    assert!(log.take().is_empty(), "nothing known is dropped");
    assert!(!a.connected());
    assert_eq!(a.remote_ip_count(), 2);
    let err = a.allocate_identity(&l("new")).unwrap_err();
    assert!(err.is_unavailable(), "retryable: {err}");
    assert!(matches!(
        err,
        ClusterIdentityError::Crd(CrdError::Unavailable(_))
    ));

    // Meanwhile (unseen by a's broken watch): b's web-2 went, and db was numbered.
    mem.set_down(false);
    let db = b.allocate_identity(&l("db")).unwrap();
    b.publish(
        &desired(&[(l("web"), web)], vec![pod("web-1", "10.2.0.5", db)]),
        &mut b_published,
        &mut BTreeSet::new(),
    )
    .unwrap();
    // a's broken watch missed these events; it recovers by listing again.
    let lost = arx.try_iter().count();
    assert!(lost > 0);
    mem.relist();
    drain(&a, &arx, &log);
    let got = log.take();
    assert_eq!(
        got,
        [
            format!("id+ {db} {}", l("db")),
            "ip- 10.2.0.6".into(),
            format!("ip+ 10.2.0.5 {db} b"),
            "listed".into()
        ]
    );
    assert!(a.connected());
    assert_eq!(a.allocate_identity(&l("new")).unwrap(), db + 1);
}

#[test]
fn hash_is_a_label_value_and_tells_sets_apart() {
    let a = l("web");
    let b = l("db");
    let h = labels_hash(&a);
    assert_eq!(h.len(), 40);
    assert!(
        h.chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
    );
    assert_eq!(h, labels_hash(&a.clone()));
    assert_ne!(h, labels_hash(&b));
}

/// What a test's node publishes.
struct Fixed(Mutex<Desired>);

impl crate::cluster::session::Local for Fixed {
    fn desired(&self) -> Desired {
        self.0.lock().unwrap().clone()
    }
}

#[test]
fn two_started_agents_publish_their_pods_and_learn_each_others() {
    let mem = Arc::new(MemApi::new());
    let (na, nb) = (
        node("a", "192.0.2.1", "10.1.0.0/24"),
        node("b", "192.0.2.2", "10.2.0.0/24"),
    );
    mem.put_node(na.clone());
    mem.put_node(nb.clone());
    let config = |n: &NodeRecord| CrdConfig {
        node: n.clone(),
        gc_interval: Duration::from_mins(1),
        gc_grace: Duration::from_mins(5),
    };
    let a = Arc::new(CrdCluster::new(mem.clone(), config(&na)));
    let b = Arc::new(CrdCluster::new(mem.clone(), config(&nb)));
    let web = a.allocate_identity(&l("web")).unwrap();
    let (log_a, log_b) = (Arc::new(Log::default()), Arc::new(Log::default()));
    let local_a = Arc::new(Fixed(Mutex::new(desired(
        &[(l("web"), web)],
        vec![pod("web-1", "10.1.0.5", web)],
    ))));
    let local_b = Arc::new(Fixed(Mutex::new(Desired::default())));
    a.clone().start(local_a.clone(), log_a.clone()).unwrap();
    b.clone().start(local_b, log_b.clone()).unwrap();
    assert!(b.wait_first_sync(Duration::from_secs(30)), "b never listed");
    // Bounded waits for the threads (a failure guard, not a timing claim).
    let until = |what: &str, done: &dyn Fn() -> bool| {
        let give_up = Instant::now() + Duration::from_secs(30);
        while !done() {
            assert!(
                Instant::now() < give_up,
                "{what}: {:?}",
                log_b.0.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    until("b learns a's pod", &|| b.remote_ip_count() == 1);
    assert!(
        log_b
            .0
            .lock()
            .unwrap()
            .contains(&format!("ip+ 10.1.0.5 {web} a"))
    );
    assert_eq!(b.nodes().keys().collect::<Vec<_>>(), ["a"]);
    // The pod goes: a withdraws its object (poked), b lets go of the address.
    *local_a.0.lock().unwrap() = desired(&[], Vec::new());
    a.poke();
    until("b forgets a's pod", &|| b.remote_ip_count() == 0);
    assert!(mem.endpoints().is_empty());
    a.stop();
    b.stop();
}

#[test]
fn a_pod_seen_before_its_identitys_key_waits_for_it() {
    let mem = Arc::new(MemApi::new());
    let (a, arx) = agent(mem.clone(), &node("a", "192.0.2.1", "10.1.0.0/24"));
    let log = Log::default();
    mem.put_node(node("b", "192.0.2.2", "10.2.0.0/24"));
    // b's watch-ordered writes as a reaches them: the number, the pod, then the key.
    assert!(mem.create_identity(300, &l("web")).unwrap());
    let mut ep = EndpointObject {
        namespace: "default".into(),
        name: "web-1".into(),
        pod_uid: "uid-web-1".into(),
        node: "b".into(),
        node_ip: "192.0.2.2".parse().unwrap(),
        ips: vec!["10.2.0.5".parse().unwrap()],
        identity: 300,
        named_ports: Vec::new(),
    };
    mem.apply_endpoint(&ep).unwrap();
    drain(&a, &arx, &log);
    assert_eq!(log.take(), ["listed", "node+ b"], "the address waits");
    assert_eq!(a.remote_ip_count(), 0);
    assert!(mem.create_key(&l("web"), 300).unwrap());
    drain(&a, &arx, &log);
    assert_eq!(
        log.take(),
        [format!("id+ 300 {}", l("web")), "ip+ 10.2.0.5 300 b".into()]
    );
    // A pod moving to a number not confirmed yet leaves the ipcache meanwhile.
    ep.identity = 301;
    mem.apply_endpoint(&ep).unwrap();
    drain(&a, &arx, &log);
    assert_eq!(log.take(), ["ip- 10.2.0.5"]);
}

#[test]
fn a_restart_withdraws_no_endpoint_before_the_pod_list_and_the_stale_ones_after_it() {
    let mem = Arc::new(MemApi::new());
    let me = node("a", "192.0.2.1", "10.1.0.0/24");
    let (c, rx) = agent(mem.clone(), &me);
    let log = Log::default();
    drain(&c, &rx, &log);
    let (mut published, mut reported) = (BTreeMap::new(), BTreeSet::new());
    let pods = vec![pod("web-1", "10.1.0.5", 300), pod("db-1", "10.1.0.6", 301)];
    c.publish(&desired(&[], pods.clone()), &mut published, &mut reported)
        .unwrap();
    assert_eq!(mem.endpoints().len(), 2);

    // The manager restarts: the session starts from what the API server holds, and its pods
    // have no uid until the pod watch lists (none is in `pods` yet).
    let (c, rx) = agent(mem.clone(), &me);
    drain(&c, &rx, &log);
    let mut published = view_of(&c).endpoints_of("a");
    assert_eq!(published.len(), 2);
    let before_list = Desired {
        pods_listed: false,
        ..desired(&[], Vec::new())
    };
    c.publish(&before_list, &mut published, &mut reported)
        .unwrap();
    assert_eq!(
        mem.endpoints().len(),
        2,
        "before the pod list no object is withdrawn: other nodes keep the pods' addresses"
    );
    let only_web = Desired {
        pods_listed: false,
        ..desired(&[], vec![pods[0].clone()])
    };
    c.publish(&only_web, &mut published, &mut reported).unwrap();
    assert_eq!(
        mem.endpoints().len(),
        2,
        "a pod known early changes nothing"
    );

    // Listed: db-1 is gone (deleted while the manager was down), web-1 stays.
    c.publish(
        &desired(&[], vec![pods[0].clone()]),
        &mut published,
        &mut reported,
    )
    .unwrap();
    let eps = mem.endpoints();
    assert_eq!(eps.len(), 1);
    assert_eq!(eps[0].name, "web-1");
}
