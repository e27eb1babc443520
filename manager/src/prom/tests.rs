//! The exposition after scripted scenarios over the fakes, read back with a small parser of the
//! text format that also checks its shape.
#![allow(
    clippy::float_cmp,
    clippy::cast_precision_loss,
    reason = "the samples are counts and exact decimals, printed and parsed back losslessly"
)]

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::datapath::FakeDatapath;
use crate::node::hostnet::FakeHostNet;
use crate::service::Manager;
use crate::service::tests::support::{fake_manager, pod_request, ready_pod};

/// `name{labels}` → value, after checking the exposition's shape: every sample belongs to a
/// family declared by a `# TYPE` line before it (with the suffixes its type allows), every value
/// is a number, a family is declared once, and the text ends with `# EOF`.
fn parse(text: &str) -> BTreeMap<String, f64> {
    let mut types: BTreeMap<String, String> = BTreeMap::new();
    let mut samples = BTreeMap::new();
    assert!(text.ends_with("# EOF\n"), "no EOF marker:\n{text}");
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, ty) = rest.split_once(' ').expect("TYPE name type");
            assert!(
                types.insert(name.into(), ty.into()).is_none(),
                "{name} declared twice"
            );
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let (key, value) = line.rsplit_once(' ').expect("sample value");
        let name = key.split('{').next().unwrap();
        let family = types
            .iter()
            .find(|(f, ty)| {
                let suffixes: &[&str] = match ty.as_str() {
                    "counter" => &["_total"],
                    "histogram" => &["_bucket", "_sum", "_count"],
                    _ => &[""],
                };
                suffixes.iter().any(|s| name == format!("{f}{s}"))
            })
            .unwrap_or_else(|| panic!("sample {name} of no declared family"));
        assert!(name.starts_with("weft_"), "{} unprefixed", family.0);
        let v: f64 = value.parse().unwrap_or_else(|_| panic!("value of {line}"));
        assert!(samples.insert(key.to_owned(), v).is_none(), "{key} twice");
    }
    samples
}

fn value(samples: &BTreeMap<String, f64>, key: &str) -> f64 {
    *samples
        .get(key)
        .unwrap_or_else(|| panic!("{key} missing from {samples:#?}"))
}

fn pod(m: &Manager, c: &str, app: &str) {
    ready_pod(m, c, app);
}

const RULE: &str = r#"[{"labels":[{"key":"name","value":"r"}],"endpointSelector":{"matchLabels":{"id":"app1"}},"ingress":[{"fromEndpoints":[{"matchLabels":{"id":"app2"}}],"toPorts":[{"ports":[{"port":"80","protocol":"TCP"}]}]}]}]"#;
const CIDR_RULE: &str = r#"[{"labels":[{"key":"name","value":"c"}],"endpointSelector":{"matchLabels":{"id":"app2"}},"egress":[{"toCIDR":["192.0.2.0/24"]}]}]"#;

fn manager() -> Arc<Manager> {
    let m = fake_manager(
        Arc::new(FakeHostNet::default()),
        Arc::new(FakeDatapath::default()),
    );
    m.set_ready();
    Arc::new(m)
}

#[test]
fn the_exposition_reports_what_happened() {
    let m = manager();
    m.record_phase("store", 1.5);
    m.record_phase("total", 12.0);
    pod(&m, "a", "app1");
    pod(&m, "b", "app2");
    pod(&m, "c", "app2");
    m.allocate(&pod_request("d", "app3")).unwrap(); // ADD still in progress
    let r = m.import_policy("r.json", RULE).unwrap();
    let r2 = m.import_policy("c.json", CIDR_RULE).unwrap();
    assert!(r.regenerated > 0 && r2.revision > r.revision);
    assert!(m.import_policy("bad.json", "[{").is_err());

    let s = parse(&super::render(m.as_ref()));
    assert_eq!(value(&s, r#"weft_endpoint_state{state="ready"}"#), 3.0);
    assert_eq!(value(&s, r#"weft_endpoint_state{state="allocated"}"#), 1.0);
    assert_eq!(value(&s, r#"weft_endpoint_state{state="deleting"}"#), 0.0);
    assert_eq!(value(&s, "weft_policy_max_revision"), r2.revision as f64);
    assert_eq!(
        value(&s, r#"weft_policy_change_total{outcome="success"}"#),
        2.0,
        "a file that does not parse is no change"
    );
    assert_eq!(value(&s, "weft_policy_implementation_delay_count"), 2.0);
    assert_eq!(
        value(&s, r#"weft_policy_implementation_delay_bucket{le="+Inf"}"#),
        2.0
    );
    let regens = value(
        &s,
        r#"weft_endpoint_regenerations_total{outcome="success"}"#,
    );
    assert_eq!(regens, m.status().regenerations as f64);
    assert!(regens >= 3.0, "{regens}");
    assert_eq!(
        value(&s, "weft_endpoint_regeneration_time_stats_seconds_count"),
        regens
    );
    let pool = r#"family="ipv4",cidr="10.0.1.0/24""#;
    assert_eq!(value(&s, &format!("weft_ipam_used{{{pool}}}")), 4.0);
    assert_eq!(value(&s, &format!("weft_ipam_capacity{{{pool}}}")), 253.0);
    // app1, app2, app3 (each with the namespace label) and the rule's CIDR.
    assert_eq!(value(&s, r#"weft_identity{kind="local"}"#), 3.0);
    assert_eq!(value(&s, r#"weft_identity{kind="cidr"}"#), 1.0);
    assert_eq!(value(&s, r#"weft_identity{kind="reserved"}"#), 2.0);
    assert_eq!(value(&s, r#"weft_identity{kind="remote"}"#), 0.0);
    assert_eq!(
        value(&s, r#"weft_restore_duration_seconds{phase="store"}"#),
        0.0015
    );
    assert_eq!(
        value(&s, r#"weft_restore_duration_seconds{phase="total"}"#),
        0.012
    );
    assert!(
        !s.keys().any(|k| k.starts_with("weft_k8s_")),
        "no Kubernetes families outside Kubernetes mode"
    );
}

#[test]
fn datapath_rows_split_into_drops_and_forwards_summed_over_endpoints() {
    let row = |ep: u32, dir: &str, reason: &str, p: u64| serde_json::json!({"endpoint_id": ep, "direction": dir, "reason": reason, "packets": p, "bytes": p * 100});
    let rows = [
        row(1, "ingress", "policy-deny", 2),
        row(2, "ingress", "policy-deny", 3),
        row(2, "egress", "policy-default", 1),
        row(1, "egress", "allow-policy", 7),
        row(1, "ingress", "pass-neighbour", 1),
        row(1, "ingress", "invalid-source", 4),
    ];
    let (drops, forwards) = super::scrape::datapath_counters(&rows);
    let key = |r: &str, d: &str| super::scrape::Verdict {
        reason: r.into(),
        direction: d.into(),
    };
    assert_eq!(drops[&key("policy-deny", "ingress")], (5, 500));
    assert_eq!(drops[&key("policy-default", "egress")], (1, 100));
    assert_eq!(drops[&key("invalid-source", "ingress")], (4, 400));
    assert_eq!(forwards[&key("allow-policy", "egress")], (7, 700));
    assert_eq!(forwards[&key("pass-neighbour", "ingress")], (1, 100));
    assert_eq!((drops.len(), forwards.len()), (3, 2));
}

/// Sends one raw HTTP/1.1 request over the stream, returns (status, body).
async fn http<S: AsyncReadExt + AsyncWriteExt + Unpin>(
    mut s: S,
    method: &str,
    path: &str,
    body: &str,
) -> (u16, String) {
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    (
        status,
        if chunked {
            dechunk(body)
        } else {
            body.to_owned()
        },
    )
}

/// The body of a chunked reply, de-chunked (hyper chunks bodies of unknown length).
fn dechunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    while let Some((len, tail)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(len.trim(), 16).expect("chunk size");
        if n == 0 {
            break;
        }
        out.push_str(&tail[..n]);
        rest = &tail[n + 2..];
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_requests_are_counted_by_route_template_and_the_tcp_port_only_reads() {
    let m = manager();
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("api.sock");
    let listener = tokio::net::UnixListener::bind(&sock).unwrap();
    tokio::spawn(crate::http::listener::serve(
        listener,
        crate::http::api::router(m.clone()),
        crate::http::listener::Limits::default(),
        std::future::pending(),
    ));
    let unix = || async { tokio::net::UnixStream::connect(&sock).await.unwrap() };
    let add = serde_json::to_string(&pod_request("a", "app1")).unwrap();
    assert_eq!(
        http(unix().await, "POST", "/v1/endpoints", &add).await.0,
        200
    );
    for id in [1, 77, 78] {
        http(unix().await, "GET", &format!("/v1/endpoints/{id}"), "").await;
    }
    assert_eq!(http(unix().await, "GET", "/v1/nope/123", "").await.0, 404);

    let tcp = crate::prom::server::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let addr = tcp.local_addr().unwrap();
    tokio::spawn(crate::prom::server::serve_tcp(tcp, m.clone()));
    let tcp = || async { tokio::net::TcpStream::connect(addr).await.unwrap() };
    let (status, body) = http(tcp().await, "POST", "/v1/endpoints", &add).await;
    assert_eq!(
        status, 404,
        "the metrics port must not serve the API: {body}"
    );
    assert_eq!(http(tcp().await, "GET", "/v1/endpoints", "").await.0, 404);
    assert_eq!(http(tcp().await, "GET", "/healthz", "").await.0, 200);
    assert_eq!(m.endpoints().len(), 1, "nothing was added through TCP");

    let (status, body) = http(tcp().await, "GET", "/metrics", "").await;
    assert_eq!(status, 200);
    let over_tcp = parse(&body);
    let (status, body) = http(unix().await, "GET", "/metrics", "").await;
    assert_eq!(status, 200);
    let s = parse(&body);
    for samples in [&over_tcp, &s] {
        let add = r#"weft_api_requests_total{method="POST",route="/v1/endpoints",status="200"}"#;
        assert_eq!(value(samples, add), 1.0);
        let get = r#"weft_api_requests_total{method="GET",route="/v1/endpoints/{id}","#;
        assert_eq!(value(samples, &format!(r#"{get}status="404"}}"#)), 2.0);
        assert_eq!(value(samples, &format!(r#"{get}status="200"}}"#)), 1.0);
        let unmatched = r#"weft_api_requests_total{method="GET",route="unmatched",status="404"}"#;
        assert_eq!(value(samples, unmatched), 1.0);
        assert!(
            !samples.keys().any(|k| k.contains("/v1/endpoints/77")),
            "raw paths never become labels"
        );
        assert_eq!(
            value(
                samples,
                r#"weft_api_process_time_seconds_count{method="GET",route="/v1/endpoints/{id}"}"#
            ),
            3.0
        );
        assert_eq!(
            value(samples, r#"weft_endpoint_state{state="allocated"}"#),
            1.0
        );
    }
}

#[test]
fn metrics_listen_takes_addresses_and_refuses_anything_else() {
    use clap::Parser;
    let parse = super::server::parse_listen;
    assert_eq!(parse(":9962").unwrap().to_string(), "0.0.0.0:9962");
    assert_eq!(parse("127.0.0.1:9").unwrap().to_string(), "127.0.0.1:9");
    assert_eq!(parse("[::1]:9962").unwrap().to_string(), "[::1]:9962");
    for bad in [
        "",
        "9962",
        "localhost:9962",
        "127.0.0.1",
        ":99999",
        "1.2.3.4:x",
    ] {
        let err = parse(bad).unwrap_err().to_string();
        assert!(
            err.contains(&format!("{bad:?}")) && err.contains("IP:PORT"),
            "{err}"
        );
    }
    let resolve = |args: &[&str]| {
        crate::daemon::config::Config::resolve(crate::daemon::config::Cli::parse_from(
            std::iter::once("weft-manager").chain(args.iter().copied()),
        ))
    };
    assert_eq!(resolve(&[]).unwrap().metrics_listen, None);
    assert_eq!(
        resolve(&["--metrics-listen", ":9962"])
            .unwrap()
            .metrics_listen,
        Some("0.0.0.0:9962".parse().unwrap())
    );
    let err = resolve(&["--metrics-listen", "nowhere"])
        .unwrap_err()
        .to_string();
    assert!(err.contains("--metrics-listen \"nowhere\""), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("m.toml");
    std::fs::write(&file, "metrics_listen = \"127.0.0.1:9090\"\n").unwrap();
    let c = resolve(&["--config", file.to_str().unwrap()]).unwrap();
    assert_eq!(c.metrics_listen, Some("127.0.0.1:9090".parse().unwrap()));
}

#[tokio::test]
async fn a_taken_port_is_refused_with_the_address() {
    let held = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = held.local_addr().unwrap();
    let err = super::server::bind(addr).await.unwrap_err().to_string();
    assert!(
        err.contains(&addr.to_string()) && err.contains("cannot listen"),
        "{err}"
    );
}

/// The `DaemonSet`'s config (conf/k8s/02-configmap.yaml, `manager.toml`) is accepted by the real
/// config parser and turns the metrics port on.
#[test]
fn the_daemonsets_config_resolves_with_metrics_on() {
    use clap::Parser;
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../conf/k8s/02-configmap.yaml");
    let yaml = std::fs::read_to_string(path).unwrap();
    let toml: String = yaml
        .lines()
        .skip_while(|l| l.trim() != "manager.toml: |")
        .skip(1)
        .take_while(|l| l.starts_with("    ") || l.is_empty())
        .flat_map(|l| [l.trim_start(), "\n"])
        .collect();
    assert!(toml.contains("k8s = true"), "{toml}");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("manager.toml");
    std::fs::write(&file, toml).unwrap();
    let c = crate::daemon::config::Config::resolve(crate::daemon::config::Cli::parse_from([
        "weft-manager",
        "--config",
        file.to_str().unwrap(),
    ]))
    .unwrap();
    assert_eq!(c.metrics_listen, Some("0.0.0.0:9962".parse().unwrap()));
}
