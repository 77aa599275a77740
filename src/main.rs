//! The `weightmap` command: inspect, validate, load, benchmark and generate
//! model weight files. See `weightmap --help`; the subcommands live in `cli/`.

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
