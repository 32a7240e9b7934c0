//! The `immortal-operator` binary: parse flags, set up logging, run the operator.

#![forbid(unsafe_code)]

use clap::Parser;
use immortal_operator::runtime::logging;
use immortal_operator::{cli, operator, trace};
use std::process::ExitCode;

// Why a cache in front of the system allocator: see runtime/allocator.rs (musl's malloc, measured).
#[global_allocator]
static ALLOC: immortal_operator::runtime::allocator::Cached =
    immortal_operator::runtime::allocator::Cached;

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
    operator::run(config)
}
