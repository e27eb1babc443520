//! weft-manager: the long-running node daemon.

use clap::Parser;
use weft_manager::daemon::config::{Cli, Config, LogFormat};

/// jemalloc's options (the allocator: `weft_manager::sys::allocator`), read at its first allocation
/// (before `main`). One arena and no per-thread
/// caches: the manager's threads rarely allocate at once on a node's few cores, and every arena
/// or cache would keep its own freed pages. Freed pages go back to the kernel at once (no decay).
/// An operator's `MALLOC_CONF` is applied after this string, so it wins.
#[repr(transparent)]
struct MallocConf(*const std::ffi::c_char);
// SAFETY: a pointer to an immutable, 'static C string literal.
unsafe impl Sync for MallocConf {}
#[unsafe(export_name = "malloc_conf")]
static MALLOC_CONF: MallocConf =
    MallocConf(c"narenas:1,tcache:false,dirty_decay_ms:0,muzzy_decay_ms:0".as_ptr());

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("WEFT_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

fn fail(msg: &dyn std::fmt::Display) -> ! {
    eprintln!("weft-manager: {msg}");
    std::process::exit(1);
}

fn main() {
    let config = Config::resolve(Cli::parse()).unwrap_or_else(|e| fail(&e));
    init_logging(config.log_format);
    if config.uninstall {
        weft_manager::node::masquerade::uninstall(&weft_manager::node::masquerade::NftCommand)
            .unwrap_or_else(|e| fail(&e));
        eprintln!(
            "weft-manager: masquerade table inet {} removed",
            weft_manager::node::masquerade::TABLE
        );
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| fail(&e));
    runtime.block_on(async {
        // Bound first: a taken port fails before start-up changes anything.
        let metrics = match config.metrics_listen {
            Some(addr) => Some(
                weft_manager::prom::server::bind(addr)
                    .await
                    .unwrap_or_else(|e| fail(&e)),
            ),
            None => None,
        };
        let started = weft_manager::daemon::start(&config)
            .await
            .unwrap_or_else(|e| fail(&format!("cannot start: {e}")));
        let manager = started.manager;
        if let Some(l) = metrics {
            tokio::spawn(weft_manager::prom::server::serve_tcp(l, manager.clone()));
        }
        // The conflist only once ready: in Kubernetes mode after the initial lists, while the
        // API already serves (status tells what is awaited).
        let becoming_ready = {
            let (manager, install, socket) = (
                manager.clone(),
                config.cni_install.clone(),
                config.socket.clone(),
            );
            tokio::spawn(async move {
                if let Some(w) = started.watchers {
                    weft_manager::daemon::k8s::become_ready(&manager, w).await;
                }
                if let Some(i) = &install {
                    let plugin = weft_manager::daemon::cni_install::plugin_beside_manager()
                        .unwrap_or_else(|e| fail(&format!("cannot find weft-cni: {e}")));
                    i.install(&plugin, &socket).unwrap_or_else(|e| fail(&e));
                }
            })
        };
        let served = weft_manager::daemon::serve(manager, started.listener, &config.socket).await;
        becoming_ready.abort();
        if let Some(i) = &config.cni_install {
            i.stopped();
        }
        if let Err(e) = served {
            fail(&e);
        }
    });
}
