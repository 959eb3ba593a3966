//! `pod-checkpointer`: the node agent that keeps a self-hosted control plane bootable.

fn main() -> anyhow::Result<()> {
    anyhow::bail!("pod-checkpointer: not built yet")
}
