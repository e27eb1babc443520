//! The replay server's push endpoint over HTTP, as the scripts use it: a push with no watch
//! open is refused (409, the caller retries), a push into an open watch reaches it and answers
//! when it entered the watches (`pushed_unix_us`, which scripts/bench-policy-k8s times from).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    reason = "an integration test crate: its helpers panic with context like its tests (clippy.toml's allow-*-in-tests covers only #[test] functions)"
)]

use serde_json::{Value, json};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use weft_k8s::replay::Replay;

const PATH: &str = "/apis/cilium.io/v2/ciliumclusterwidenetworkpolicies";

fn now_us() -> u64 {
    u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_micros(),
    )
    .unwrap()
}

/// One push (an HTTP/1.1 POST of `event` on its own connection); the status and the JSON body.
async fn push(url: &str, event: &Value) -> (u16, Value) {
    let body = event.to_string();
    let addr = url.strip_prefix("http://").unwrap();
    let mut s = TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "POST /replay/push?path={PATH} HTTP/1.1\r\nHost: replay\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).await.unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").expect("an HTTP response");
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (
        status,
        serde_json::from_str(body.trim()).expect("a JSON body"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_answers_when_the_event_entered_the_open_watches() {
    let replay = Replay::default();
    let url = replay.serve().await.unwrap();
    let event =
        json!({"type": "MODIFIED", "object": {"metadata": {"name": "x", "resourceVersion": "7"}}});

    let (status, body) = push(&url, &event).await;
    assert_eq!(status, 409, "no watch open: {body}");
    assert_eq!(body["delivered"], 0);

    // A hanging watch of the path (read until the event arrives).
    let addr = url.strip_prefix("http://").unwrap();
    let mut w = TcpStream::connect(addr).await.unwrap();
    w.write_all(format!("GET {PATH}?watch=true HTTP/1.1\r\nHost: replay\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut w = BufReader::new(w);
    let mut line = String::new();
    while line != "\r\n" {
        line.clear();
        w.read_line(&mut line).await.unwrap();
    }
    // The server subscribed the watch before it answered the headers.
    let before = now_us();
    let (status, body) = push(&url, &event).await;
    let after = now_us();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["delivered"], 1);
    let pushed = body["pushed_unix_us"].as_u64().expect("pushed_unix_us");
    assert!(
        (before..=after).contains(&pushed),
        "pushed at {pushed}, outside the request's {before}..={after}"
    );

    // The watch got the event (a chunk of the streamed body holds its line).
    let got = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            line.clear();
            w.read_line(&mut line).await.unwrap();
            if line.contains("MODIFIED") {
                return serde_json::from_str::<Value>(line.trim()).unwrap();
            }
        }
    })
    .await
    .expect("the event reached the watch within 10 s");
    assert_eq!(got, event);
}
