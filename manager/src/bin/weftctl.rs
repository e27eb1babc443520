//! weftctl: the operator CLI.

use clap::Parser;

fn main() {
    let cli = weft_manager::ctl::Cli::parse();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    if let Err(e) = runtime.block_on(weft_manager::ctl::run(cli)) {
        eprintln!("weftctl: {e}");
        std::process::exit(1);
    }
}
