//! The `corral` command line.

mod cli;

fn main() -> std::process::ExitCode {
    corral::keep_transient_buffers_in_the_heap();
    cli::main()
}
