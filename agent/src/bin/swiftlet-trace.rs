//! `swiftlet-trace`: the same client as `swiftlet trace` (see `swiftlet::trace::cli`).
fn main() -> std::process::ExitCode {
    swiftlet::trace::cli::main(std::env::args_os())
}
