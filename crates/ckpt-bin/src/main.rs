//! `pod-checkpointer`: the node agent that keeps a self-hosted Kubernetes control plane
//! bootable (see the workspace README and ARCHITECTURE.md, Command-line contract for the command-line contract).
//!
//! Exit codes: 0 success (also after self-GC and SIGTERM), 2 usage or configuration
//! error (the message names the flag), 1 runtime failure.

fn main() -> std::process::ExitCode {
    ckpt_bin::main()
}
