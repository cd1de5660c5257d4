//! The `corral` command line.

mod cli;

fn main() -> std::process::ExitCode {
    corral::tune_the_allocator();
    cli::main()
}
