//! weftctl: the operator CLI of a Weft node, over weft-manager's REST API on its unix socket.
//! It depends on the wire types (`weft-api`) only.

mod cli;
mod commands;
mod render;
mod table;

use clap::Parser;

fn main() {
    let cli = cli::Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("weftctl: cannot start the tokio runtime: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = runtime.block_on(commands::run(cli)) {
        eprintln!("weftctl: {e}");
        std::process::exit(1);
    }
}
