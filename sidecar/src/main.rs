fn main() -> std::process::ExitCode {
    bindery_sidecar::cli::main()
}
