//! A custom agent binary: pod-checkpointer with the `keep-forever` strategy of this crate.
//! This file is the whole recipe (docs/development.md, "A strategy of your own"): `ckpt-bin`'s program,
//! plus a reference to each strategy crate so the linker keeps its registration
//! (inventory#7).
//!
//! ```sh
//! cargo build --release -p ckpt-gc-example --example pod-checkpointer-custom
//! target/release/examples/pod-checkpointer-custom strategies   # lists keep-forever
//! ```

use ckpt_gc_example as _; // inventory#7: link the crate so its strategy registers

fn main() -> std::process::ExitCode {
    ckpt_bin::main()
}
