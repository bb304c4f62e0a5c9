//! The `ucrypt` binary: parses arguments and hands over to `ucrypt_cli`.

/// Large buffers page-aligned, so O_DIRECT needs no bounce copy
/// (`backend::PageAlignLarge`).
#[global_allocator]
static ALLOC: backend::PageAlignLarge = backend::PageAlignLarge;

fn main() -> std::process::ExitCode {
    ucrypt_cli::main()
}
