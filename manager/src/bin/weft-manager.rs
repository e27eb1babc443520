//! weft-manager: the long-running node daemon.

use clap::Parser;
use weft_manager::config::{Cli, Config, LogFormat};

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
    // Before any other thread exists (the runtime's, sled's).
    weft_manager::allocator::tune();
    if config.uninstall {
        weft_manager::masquerade::uninstall(&weft_manager::masquerade::NftCommand)
            .unwrap_or_else(|e| fail(&e));
        eprintln!(
            "weft-manager: masquerade table inet {} removed",
            weft_manager::masquerade::TABLE
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
                weft_manager::prom::bind(addr)
                    .await
                    .unwrap_or_else(|e| fail(&e)),
            ),
            None => None,
        };
        let (manager, listener) = weft_manager::daemon::start(&config)
            .await
            .unwrap_or_else(|e| fail(&format!("cannot start: {e}")));
        if let Some(l) = metrics {
            tokio::spawn(weft_manager::prom::serve_tcp(l, manager.clone()));
        }
        if let Some(i) = &config.cni_install {
            let plugin = weft_manager::cni_install::plugin_beside_manager()
                .unwrap_or_else(|e| fail(&format!("cannot find weft-cni: {e}")));
            i.install(&plugin, &config.socket)
                .unwrap_or_else(|e| fail(&e));
        }
        let served = weft_manager::daemon::serve(manager, listener, &config.socket).await;
        if let Some(i) = &config.cni_install {
            i.uninstall();
        }
        if let Err(e) = served {
            fail(&e);
        }
    });
}
