//! The `immortal-operator` binary: parse flags, set up logging, run the operator.

#![forbid(unsafe_code)]

use immortal_operator::runtime::logging;
use immortal_operator::{cli, operator, trace};
use std::process::ExitCode;

fn main() -> ExitCode {
    let args = cli::Args::try_parse_given(std::env::args_os()).unwrap_or_else(|e| e.exit());
    if let Err(e) = args.check() {
        return bad_flags(&e);
    }
    if let Some(cli::Command::Trace(t)) = &args.command {
        return trace::run(t);
    }
    let config = match cli::Config::try_from(args) {
        Ok(c) => c,
        Err(e) => return bad_flags(&e),
    };
    logging::init(config.log_format);
    operator::run(config)
}

/// Bad flags exit 2, as clap's own refusals do.
fn bad_flags(e: &cli::InvalidFlags) -> ExitCode {
    eprintln!("immortal-operator: {e}");
    ExitCode::from(2)
}
