//! The `immortal-operator` binary: parse flags, set up logging, run the operator.

use clap::Parser;
use immortal_operator::{cli, controller, logging, trace};
use std::process::ExitCode;

// Why a cache in front of the system allocator: see allocator.rs (musl's malloc, measured).
#[global_allocator]
static ALLOC: immortal_operator::allocator::Cached = immortal_operator::allocator::Cached;

fn main() -> ExitCode {
    let args = cli::Args::parse();
    if let Some(cli::Command::Trace(t)) = &args.command {
        return trace::run(t);
    }
    let config = match cli::Config::try_from(args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("immortal-operator: {e}");
            return ExitCode::from(2);
        }
    };
    logging::init(config.log_format);
    controller::run(config)
}
