//! The `ucrypt` binary: parses arguments and hands over to `ucrypt_cli`.
fn main() -> std::process::ExitCode {
    ucrypt_cli::main()
}
