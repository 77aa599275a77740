//! The `weightmap` command: inspect, validate, load, benchmark and generate
//! model weight files. See `weightmap --help`; each subcommand is a file of
//! `cmd/`. The tools the command needs and a runtime does not (the
//! synthetic-model generator, shard splitting, never-clobber output files)
//! live here too, so the library only loads.

#![deny(unsafe_op_in_unsafe_fn)]

mod cmd;
mod outfile;
mod split;
mod synth;

fn main() -> std::process::ExitCode {
    cmd::main()
}
