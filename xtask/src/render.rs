//! `cargo xtask render`: the install manifests as multi-document YAML, for `kubectl apply`,
//! GitOps or review: the agent's own `pod-checkpointer render` (the same library code,
//! `ckpt_bin::render`), writing into a directory. `deploy/pod-checkpointer.yaml` is the
//! default render, checked in and kept current by a test.

use std::path::Path;

use anyhow::Context;

use ckpt_bin::render::{KubernetesVersion, ManifestArgs, render, to_yaml};

/// The file `-o DIR` writes, and the checked-in default render's name under `deploy/`.
pub(crate) const FILE_NAME: &str = "pod-checkpointer.yaml";

/// Write the manifests that install pod-checkpointer.
#[derive(clap::Args)]
pub(crate) struct Render {
    #[command(flatten)]
    manifest: ManifestArgs,
    /// Write DIR/pod-checkpointer.yaml, or "-" for stdout
    #[arg(short = 'o', long = "output", value_name = "DIR|-", default_value = "-")]
    output: String,
}

impl Render {
    pub(crate) fn run(&self) -> anyhow::Result<()> {
        let yaml = render_yaml(&self.manifest)?;
        if self.output == "-" {
            print!("{yaml}");
            return Ok(());
        }
        let dir = Path::new(&self.output);
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let path = dir.join(FILE_NAME);
        std::fs::write(&path, yaml).with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("wrote {}", path.display());
        Ok(())
    }
}

/// The YAML for these flags; without `--kubernetes-version`, for current clusters.
pub(crate) fn render_yaml(args: &ManifestArgs) -> anyhow::Result<String> {
    let options = args.options(KubernetesVersion::NEWEST)?;
    Ok(to_yaml(&render(&options))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checked_in_manifest_is_the_default_render() {
        let path = ckpt_e2e::project_root().join("deploy").join(FILE_NAME);
        let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
        let current = render_yaml(&ManifestArgs::default()).unwrap();
        assert!(
            checked_in == current,
            "{} is out of date: regenerate it with `cargo xtask render -o deploy`",
            path.display()
        );
    }

    /// CI has no container engine, so the recipe is checked here: what it copies exists,
    /// every workspace member is copied, and the entrypoint is the agent.
    #[test]
    fn the_containerfile_copies_the_workspace_and_runs_the_agent() {
        let root = ckpt_e2e::project_root();
        let containerfile = std::fs::read_to_string(root.join("Containerfile")).unwrap();
        let copies: Vec<Vec<&str>> = containerfile
            .lines()
            .filter(|line| line.starts_with("COPY ") && !line.contains("--from"))
            .map(|line| line.split_whitespace().skip(1).collect())
            .collect();
        for words in &copies {
            for source in &words[..words.len() - 1] {
                assert!(
                    root.join(source).exists(),
                    "the Containerfile copies a missing {source}"
                );
            }
        }
        let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
        let members = manifest
            .lines()
            .find_map(|line| line.strip_prefix("members = "))
            .expect("workspace members");
        for member in members.split('"').skip(1).step_by(2) {
            let top = member.split('/').next().unwrap();
            assert!(
                copies.iter().any(|words| words[..words.len() - 1].contains(&top)),
                "the Containerfile does not copy the workspace member {member}"
            );
        }
        assert!(containerfile.contains(r#"ENTRYPOINT ["/pod-checkpointer"]"#));
        assert!(containerfile.contains("-p ckpt-bin --bin pod-checkpointer"));
    }
}
