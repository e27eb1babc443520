//! Test support: plays a Kubernetes API server from a JSON script (see
//! `weft_k8s::replay::Replay::from_script`) for the end-to-end test, which has no real API
//! server. Writes a kubeconfig for it, then serves until killed; events are pushed into open
//! watches with `POST /replay/push?path=PATH` (body: the watch event).
//!
//! Usage: `weft-k8s-replay SCRIPT.json KUBECONFIG_OUT [LISTEN_ADDR]`

use weft_k8s::replay::Replay;

fn fail(msg: &str) -> ! {
    eprintln!("weft-k8s-replay: {msg}");
    std::process::exit(1);
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let ([script, out] | [script, out, _]) = args.as_slice() else {
        fail("usage: weft-k8s-replay SCRIPT.json KUBECONFIG_OUT [LISTEN_ADDR]");
    };
    let addr = args.get(2).map_or("127.0.0.1:0", String::as_str);
    let text = std::fs::read_to_string(script).unwrap_or_else(|e| fail(&format!("{script}: {e}")));
    let value: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| fail(&format!("{script}: {e}")));
    let replay = Replay::from_script(&value).unwrap_or_else(|e| fail(&format!("{script}: {e}")));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| fail(&format!("runtime: {e}")));
    rt.block_on(async move {
        let url = replay
            .serve_on(addr)
            .await
            .unwrap_or_else(|e| fail(&format!("cannot listen on {addr}: {e}")));
        let tmp = format!("{out}.tmp");
        std::fs::write(&tmp, Replay::kubeconfig(&url))
            .and_then(|()| std::fs::rename(&tmp, out))
            .unwrap_or_else(|e| fail(&format!("{out}: {e}")));
        eprintln!("weft-k8s-replay: serving {url}");
        std::future::pending::<()>().await;
    });
}
