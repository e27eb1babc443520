//! The hostile-input table (issue #14): every request a local attacker or an unlucky caller can
//! send to the API, each with the exact status, error kind and message it must get, and proof
//! that nothing changed (endpoints, IPAM, identities, policies, datapath calls and maps, host
//! links and routes). Served by the real router and the bounded accept loop over a unix socket,
//! with raw bytes on the wire so malformed HTTP reaches the server as sent.

use std::path::PathBuf;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use weft_api::{AllocateRequest, Label, RegisterRequest};

use crate::datapath::FakeDatapath;
use crate::node::hostnet::FakeHostNet;
use crate::service::Manager;

struct World {
    m: Arc<Manager>,
    net: Arc<FakeHostNet>,
    dp: Arc<FakeDatapath>,
    sock: PathBuf,
    _dir: tempfile::TempDir,
}

fn world() -> World {
    let net = Arc::new(FakeHostNet::default());
    let dp = Arc::new(FakeDatapath::default());
    let m = Arc::new(crate::service::tests::support::fake_manager(
        net.clone(),
        dp.clone(),
    ));
    m.set_ready();
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("api.sock");
    let listener = UnixListener::bind(&sock).unwrap();
    tokio::spawn(crate::http::listener::serve(
        listener,
        crate::http::api::router(m.clone()),
        crate::http::listener::Limits::default(),
        std::future::pending(),
    ));
    World {
        m,
        net,
        dp,
        sock,
        _dir: dir,
    }
}

/// Everything a request could change, as comparable text.
fn snapshot(w: &World) -> String {
    format!(
        "{}\n{}\n{}\n{}\n{:?}\n{:?}\n{:?}\n{:?}",
        serde_json::to_string(&w.m.endpoints()).unwrap(),
        serde_json::to_string(&w.m.allocations()).unwrap(),
        serde_json::to_string(&w.m.identities()).unwrap(),
        w.m.policies(),
        w.dp.calls(),
        w.dp.ipcache(),
        w.net.links.lock().unwrap(),
        w.net.routers.lock().unwrap(),
    )
}

/// Sends raw bytes, returns (status, parsed JSON body).
async fn send(sock: &std::path::Path, raw: &[u8]) -> (u16, serde_json::Value) {
    let mut s = UnixStream::connect(sock).await.unwrap();
    // The server may answer (413) and close before reading everything: EPIPE is expected.
    let _ = s.write_all(raw).await;
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out).await;
    let text = String::from_utf8_lossy(&out);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP answer: {text:?}"));
    // Chunked or not, the JSON object is between the first '{' and the last '}'.
    let json = match (body.find('{'), body.rfind('}')) {
        (Some(a), Some(b)) => serde_json::from_str(&body[a..=b]).unwrap_or_default(),
        _ => serde_json::Value::Null,
    };
    (status, json)
}

fn request(method: &str, path: &str, body: &[u8]) -> Vec<u8> {
    let mut r = format!(
        "{method} {path} HTTP/1.1\r\nHost: weft\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    r.extend_from_slice(body);
    r
}

fn alloc_body(f: impl FnOnce(&mut AllocateRequest)) -> Vec<u8> {
    let mut r = AllocateRequest {
        container_id: "c9".into(),
        ifname: "eth0".into(),
        netns: "/var/run/netns/p9".into(),
        pod_namespace: Some("default".into()),
        pod_name: Some("p9".into()),
        labels: vec![Label {
            key: "app".into(),
            value: "web".into(),
        }],
    };
    f(&mut r);
    serde_json::to_vec(&r).unwrap()
}

fn ready_body(ep: &weft_api::Endpoint, f: impl FnOnce(&mut RegisterRequest)) -> Vec<u8> {
    let mut r = RegisterRequest {
        container_id: ep.container_id.clone(),
        host_ifname: ep.host_ifname.clone(),
        host_ifindex: 10,
        host_mac: weft_api::MacAddr::new([2, 0, 0, 0, 0, 1]),
        pod_mac: weft_api::MacAddr::new([2, 0, 0, 0, 0, 2]),
    };
    f(&mut r);
    serde_json::to_vec(&r).unwrap()
}

/// A register body with a field changed to something no `RegisterRequest` can hold.
fn ready_json(ep: &weft_api::Endpoint, f: impl FnOnce(&mut serde_json::Value)) -> Vec<u8> {
    let mut v: serde_json::Value = serde_json::from_slice(&ready_body(ep, |_| {})).unwrap();
    f(&mut v);
    serde_json::to_vec(&v).unwrap()
}

struct Case {
    name: &'static str,
    raw: Vec<u8>,
    status: u16,
    kind: &'static str,
    /// A piece of the message that names the problem.
    says: &'static str,
}

fn case(
    name: &'static str,
    raw: Vec<u8>,
    status: u16,
    kind: &'static str,
    says: &'static str,
) -> Case {
    Case {
        name,
        raw,
        status,
        kind,
        says,
    }
}

fn policy(text: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({"file": "p.yaml", "content": text})).unwrap()
}

#[expect(clippy::too_many_lines, reason = "one table, one line per case")]
fn cases(ready: &weft_api::Endpoint) -> Vec<Case> {
    let id = ready.id;
    let ep_path = format!("/v1/endpoints/{id}/ready");
    let labels_path = format!("/v1/endpoints/{id}/labels");
    let labels = |add: &[&str], remove: &[&str]| {
        serde_json::to_vec(&serde_json::json!({"add": add, "remove": remove})).unwrap()
    };
    let big = vec![b' '; weft_api::MAX_REQUEST_BODY + 1];
    vec![
        // Allocate: every field an attacker controls (defects 5, 9).
        case(
            "allocate ifname ../../x",
            request(
                "POST",
                "/v1/endpoints",
                &alloc_body(|r| r.ifname = "../../x".into()),
            ),
            400,
            "invalid",
            "ifname",
        ),
        case(
            "allocate ifname too long",
            request(
                "POST",
                "/v1/endpoints",
                &alloc_body(|r| r.ifname = "a".repeat(16)),
            ),
            400,
            "invalid",
            "ifname",
        ),
        case(
            "allocate ifname with newline",
            request(
                "POST",
                "/v1/endpoints",
                &alloc_body(|r| r.ifname = "e\nx".into()),
            ),
            400,
            "invalid",
            "ifname",
        ),
        case(
            "allocate netns /etc",
            request(
                "POST",
                "/v1/endpoints",
                &alloc_body(|r| r.netns = "/etc".into()),
            ),
            400,
            "invalid",
            "not a network namespace",
        ),
        case(
            "allocate netns regular file",
            request(
                "POST",
                "/v1/endpoints",
                &alloc_body(|r| r.netns = "/etc/hostname".into()),
            ),
            400,
            "invalid",
            "not a network namespace",
        ),
        case(
            "allocate netns relative",
            request(
                "POST",
                "/v1/endpoints",
                &alloc_body(|r| r.netns = "netns/x".into()),
            ),
            400,
            "invalid",
            "absolute path",
        ),
        case(
            "allocate netns with ..",
            request(
                "POST",
                "/v1/endpoints",
                &alloc_body(|r| r.netns = "/var/run/netns/../../../etc".into()),
            ),
            400,
            "invalid",
            "'..'",
        ),
        case(
            "allocate 100 KB container id",
            request(
                "POST",
                "/v1/endpoints",
                &alloc_body(|r| r.container_id = "a".repeat(100_000)),
            ),
            400,
            "invalid",
            "at most 128",
        ),
        case(
            "allocate container id with /",
            request(
                "POST",
                "/v1/endpoints",
                &alloc_body(|r| r.container_id = "a/../b".into()),
            ),
            400,
            "invalid",
            "container_id",
        ),
        case(
            "allocate empty container id",
            request(
                "POST",
                "/v1/endpoints",
                &alloc_body(|r| r.container_id = String::new()),
            ),
            400,
            "invalid",
            "container_id",
        ),
        case(
            "allocate label key NUL",
            request(
                "POST",
                "/v1/endpoints",
                &alloc_body(|r| r.labels[0].key = "a\0b".into()),
            ),
            400,
            "invalid",
            "control characters",
        ),
        case(
            "allocate label key space",
            request(
                "POST",
                "/v1/endpoints",
                &alloc_body(|r| r.labels[0].key = "a b".into()),
            ),
            400,
            "invalid",
            "whitespace",
        ),
        case(
            "allocate label value newline",
            request(
                "POST",
                "/v1/endpoints",
                &alloc_body(|r| r.labels[0].value = "web\nid=admin".into()),
            ),
            400,
            "invalid",
            "whitespace",
        ),
        case(
            "allocate 300 labels",
            request(
                "POST",
                "/v1/endpoints",
                &alloc_body(|r| {
                    r.labels = (0..300)
                        .map(|i| Label {
                            key: format!("k{i}"),
                            value: "v".into(),
                        })
                        .collect();
                }),
            ),
            400,
            "invalid",
            "at most 256",
        ),
        case(
            "allocate pod name newline",
            request(
                "POST",
                "/v1/endpoints",
                &alloc_body(|r| r.pod_name = Some("p\nINFO fake".into())),
            ),
            400,
            "invalid",
            "pod_name",
        ),
        case(
            "allocate pod namespace ESC",
            request(
                "POST",
                "/v1/endpoints",
                &alloc_body(|r| r.pod_namespace = Some("ns\x1b[2J".into())),
            ),
            400,
            "invalid",
            "pod_namespace",
        ),
        case(
            "allocate not JSON",
            request("POST", "/v1/endpoints", b"{\"container_id\":"),
            400,
            "invalid",
            "not valid JSON",
        ),
        case(
            "allocate not UTF-8",
            request("POST", "/v1/endpoints", b"{\"container_id\":\"\xff\xfe\"}"),
            400,
            "invalid",
            "not valid JSON",
        ),
        case(
            "allocate missing field",
            request("POST", "/v1/endpoints", b"{\"container_id\":\"c1\"}"),
            400,
            "invalid",
            "missing field",
        ),
        // Error contract of the HTTP layer itself (defect 10).
        case(
            "body over the limit",
            request("POST", "/v1/endpoints", &big),
            413,
            "too_large",
            "bytes weft-manager accepts",
        ),
        case(
            "wrong method",
            request("PUT", "/v1/endpoints", b""),
            405,
            "method_not_allowed",
            "method",
        ),
        case(
            "non-numeric endpoint id",
            request("GET", "/v1/endpoints/abc", b""),
            400,
            "invalid",
            "abc",
        ),
        case(
            "endpoint id overflow",
            request("GET", "/v1/endpoints/99999999999", b""),
            400,
            "invalid",
            "",
        ),
        case(
            "unknown path",
            request("GET", "/v1/nope", b""),
            404,
            "not_found",
            "docs/API.md",
        ),
        case(
            "DELETE without owner",
            request("DELETE", "/v1/endpoints", b""),
            400,
            "invalid",
            "container_id and ifname",
        ),
        case(
            "DELETE with a long container id",
            request(
                "DELETE",
                &format!(
                    "/v1/endpoints?container_id={}&ifname=eth0",
                    "a".repeat(2000)
                ),
                b"",
            ),
            400,
            "invalid",
            "at most 128",
        ),
        case(
            "DELETE ifname traversal",
            request(
                "DELETE",
                "/v1/endpoints?container_id=c1&ifname=..%2F..%2Fx",
                b"",
            ),
            400,
            "invalid",
            "ifname",
        ),
        case(
            "query bad percent-encoding",
            request("GET", "/v1/endpoints?container_id=%ff%fe&ifname=eth0", b""),
            400,
            "invalid",
            "",
        ),
        // Register (defect 9, 10: a ready endpoint cannot be moved; client errors are 4xx).
        case(
            "re-ready with another host MAC",
            request(
                "POST",
                &ep_path,
                &ready_body(ready, |r| {
                    r.host_mac = weft_api::MacAddr::new([2, 0, 0, 0, 0, 0x99]);
                }),
            ),
            409,
            "conflict",
            "already ready",
        ),
        case(
            "re-ready with another ifindex",
            request(
                "POST",
                &ep_path,
                &ready_body(ready, |r| r.host_ifindex = 4242),
            ),
            409,
            "conflict",
            "already ready",
        ),
        case(
            "ready with a bad MAC",
            request(
                "POST",
                &ep_path,
                &ready_json(ready, |r| r["pod_mac"] = "zz:zz".into()),
            ),
            400,
            "invalid",
            "pod_mac",
        ),
        case(
            "ready with ifindex 0",
            request("POST", &ep_path, &ready_body(ready, |r| r.host_ifindex = 0)),
            400,
            "invalid",
            "host_ifindex",
        ),
        case(
            "ready by another container",
            request(
                "POST",
                &ep_path,
                &ready_body(ready, |r| r.container_id = "other".into()),
            ),
            409,
            "conflict",
            "belongs to container",
        ),
        case(
            "ready of an unknown endpoint",
            request(
                "POST",
                "/v1/endpoints/777/ready",
                &ready_body(ready, |_| {}),
            ),
            404,
            "not_found",
            "777",
        ),
        // Labels API (defect 9).
        case(
            "labels NUL key",
            request("POST", &labels_path, &labels(&["\0=x"], &[])),
            400,
            "invalid",
            "control characters",
        ),
        case(
            "labels key with space",
            request("POST", &labels_path, &labels(&["a b=x"], &[])),
            400,
            "invalid",
            "whitespace",
        ),
        case(
            "labels value with newline",
            request("POST", &labels_path, &labels(&["a=x\ny"], &[])),
            400,
            "invalid",
            "whitespace",
        ),
        case(
            "labels remove key with NUL",
            request("POST", &labels_path, &labels(&[], &["a\0"])),
            400,
            "invalid",
            "control characters",
        ),
        case(
            "labels change the namespace",
            request(
                "POST",
                &labels_path,
                &labels(&["k8s:io.kubernetes.pod.namespace=kube-system"], &[]),
            ),
            400,
            "invalid",
            "namespace",
        ),
        case(
            "labels not JSON",
            request("POST", &labels_path, b"[1,2"),
            400,
            "invalid",
            "not valid JSON",
        ),
        // Policy files (defect 9, 10).
        case(
            "policy selector key with space",
            request(
                "POST",
                "/v1/policies",
                &policy(
                    "[{\"endpointSelector\":{\"matchLabels\":{\"a b\":\"x\"}},\"ingress\":[{}]}]",
                ),
            ),
            400,
            "invalid",
            "whitespace",
        ),
        case(
            "policy selector value with newline",
            request(
                "POST",
                "/v1/policies",
                &policy(
                    "[{\"endpointSelector\":{\"matchLabels\":{\"app\":\"x\\ny\"}},\"ingress\":[{}]}]",
                ),
            ),
            400,
            "invalid",
            "whitespace",
        ),
        case(
            "policy garbage",
            request("POST", "/v1/policies", &policy("\u{0}\u{1}not a policy")),
            400,
            "invalid",
            "",
        ),
        case(
            "policy body not JSON",
            request("POST", "/v1/policies", b"apiVersion: v1"),
            400,
            "invalid",
            "not valid JSON",
        ),
        // The same import with the file's bytes as the body (weftctl's form).
        case(
            "policy file without a name",
            request("PUT", "/v1/policies", b"[]"),
            400,
            "invalid",
            "no file name: give it as ?file=NAME",
        ),
        case(
            "policy file with an empty name",
            request("PUT", "/v1/policies?file=", b"[]"),
            400,
            "invalid",
            "no file name",
        ),
        case(
            "policy file not UTF-8",
            request("PUT", "/v1/policies?file=p%20q.json", b"[\"\xff\"]"),
            400,
            "invalid",
            "p q.json: not UTF-8 text",
        ),
        case(
            "policy file garbage",
            request("PUT", "/v1/policies?file=p.yaml", b"\x00\x01not a policy"),
            400,
            "invalid",
            "p.yaml",
        ),
        case(
            "trace body not JSON",
            request("POST", "/v1/policy/trace", b"nope"),
            400,
            "invalid",
            "not valid JSON",
        ),
        case(
            "gc body not JSON",
            request("POST", "/v1/gc", b"{\"valid_attachments\": 5}"),
            400,
            "invalid",
            "not valid JSON",
        ),
        case(
            "map dump of an unknown map",
            request("GET", "/v1/maps/..%2F..%2Fetc", b""),
            404,
            "not_found",
            "",
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_api_requests_get_their_exact_error_and_change_nothing() {
    let w = world();
    // One ready endpoint to attack.
    let ep =
        w.m.allocate(&AllocateRequest {
            container_id: "c1".into(),
            ifname: "eth0".into(),
            netns: "/var/run/netns/p1".into(),
            pod_namespace: Some("default".into()),
            pod_name: Some("p1".into()),
            labels: vec![Label {
                key: "app".into(),
                value: "web".into(),
            }],
        })
        .unwrap();
    let ready =
        w.m.register(
            ep.id,
            &RegisterRequest {
                container_id: "c1".into(),
                host_ifname: ep.host_ifname.clone(),
                host_ifindex: 10,
                host_mac: weft_api::MacAddr::new([2, 0, 0, 0, 0, 1]),
                pod_mac: weft_api::MacAddr::new([2, 0, 0, 0, 0, 2]),
            },
        )
        .unwrap();
    let table = cases(&ready);
    assert!(table.len() >= 40, "the table has {} cases", table.len());
    let mut failures = Vec::new();
    for c in &table {
        let before = snapshot(&w);
        let (status, body) = send(&w.sock, &c.raw).await;
        let kind = body["kind"].as_str().unwrap_or("<no JSON kind>");
        let message = body["message"].as_str().unwrap_or("<no JSON message>");
        if status != c.status || kind != c.kind || !message.contains(c.says) {
            failures.push(format!(
                "{}: got {status} {kind} {message:?}, want {} {} containing {:?}",
                c.name, c.status, c.kind, c.says
            ));
        }
        if message.len() > 600 {
            failures.push(format!(
                "{}: message echoes unbounded input ({} bytes)",
                c.name,
                message.len()
            ));
        }
        if snapshot(&w) != before {
            failures.push(format!("{}: state changed", c.name));
        }
    }
    // The manager still serves after all of it.
    let (status, _) = send(&w.sock, &request("GET", "/v1/healthz", b"")).await;
    assert_eq!(status, 200);
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        table.len(),
        failures.join("\n")
    );
}

#[test]
fn weftctl_tells_cluster_rules_by_the_label_the_watchers_set() {
    assert_eq!(
        weft_k8s::policy::origin_label().to_string(),
        weft_api::policy::CLUSTER_POLICY_LABEL
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_file_sent_as_bytes_imports_as_its_json_form_does() {
    let rules = r#"[{"labels":[{"key":"name","value":"r1"}],"endpointSelector":{"matchLabels":{"app":"web"}},"ingress":[{"fromEndpoints":[{"matchLabels":{"app":"cli"}}]}]}]"#;
    let by_bytes = world();
    let by_json = world();
    // A name that needs percent-encoding comes back whole in the manager's messages.
    let name = "dir with space/a&b=c?.json";
    let client = weft_api::client::Client::new(&by_bytes.sock);
    let path = weft_api::policy::import_file_path(name);
    let put: weft_api::ImportResult = client
        .put_bytes(&path, rules.as_bytes().to_vec())
        .await
        .unwrap();
    let post: weft_api::ImportResult = weft_api::client::Client::new(&by_json.sock)
        .post(
            "/v1/policies",
            &weft_api::ImportRequest {
                file: name.into(),
                content: rules.into(),
            },
        )
        .await
        .unwrap();
    assert_eq!((put.revision, put.rules), (post.revision, post.rules));
    assert_eq!(put.rules, 1);
    assert_eq!(by_bytes.m.policies(), by_json.m.policies());
    let broken = client
        .put_bytes::<weft_api::ImportResult>(&path, b"[{\"endpointSelector\": 7}]".to_vec())
        .await
        .unwrap_err()
        .to_string();
    assert!(broken.contains(name), "{broken}");
    assert_eq!(
        by_bytes.m.policies(),
        by_json.m.policies(),
        "a broken file changes nothing"
    );
}
