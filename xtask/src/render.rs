//! `cargo xtask render`: the install manifests as multi-document YAML, for `kubectl apply`,
//! GitOps or review: the agent's own `pod-checkpointer render` (the same library code,
//! `ckpt_render`), writing into a directory. `deploy/pod-checkpointer.yaml` is the
//! default render, checked in and kept current by a test.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::Context;
use ckpt_bin::render::BuiltIn;
use ckpt_render::{AgentChecks, KubernetesVersion, ManifestArgs, render, to_yaml};

/// The file `-o DIR` writes, and the checked-in default render's name under `deploy/`.
pub(crate) const FILE_NAME: &str = "pod-checkpointer.yaml";

/// Write the manifests that install pod-checkpointer.
#[derive(clap::Args)]
pub(crate) struct Render {
    #[command(flatten)]
    manifest: ManifestArgs,
    #[command(flatten)]
    agent: AgentBinaryArg,
    /// Write DIR/pod-checkpointer.yaml, or "-" for stdout
    #[arg(short = 'o', long = "output", value_name = "DIR|-", default_value = "-")]
    output: String,
}

impl Render {
    pub(crate) fn run(&self) -> anyhow::Result<()> {
        let options = self
            .manifest
            .options_for(KubernetesVersion::NEWEST, self.agent.checks().as_ref())?;
        let yaml = to_yaml(&render(&options))?;
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
#[cfg(test)]
pub(crate) fn render_yaml(args: &ManifestArgs) -> anyhow::Result<String> {
    let options = args.options_for(KubernetesVersion::NEWEST, &BuiltIn)?;
    Ok(to_yaml(&render(&options))?)
}

/// `--agent-binary`, shared by `render` and `deploy`.
#[derive(clap::Args)]
pub(crate) struct AgentBinaryArg {
    /// The agent binary the manifests' image runs, when it is not this workspace's own
    /// (e.g. one built with an extra strategy crate): the strategy and the config are
    /// checked by asking it (`strategies`, `check-config`) [default: the built-in registry]
    #[arg(long, value_name = "PATH")]
    pub(crate) agent_binary: Option<PathBuf>,
}

impl AgentBinaryArg {
    pub(crate) fn checks(&self) -> Box<dyn AgentChecks> {
        match &self.agent_binary {
            Some(path) => Box::new(AgentBinary(path.clone())),
            None => Box::new(BuiltIn),
        }
    }
}

/// An agent binary asked what it accepts: `PATH strategies` and `PATH check-config -`.
struct AgentBinary(PathBuf);

impl AgentBinary {
    /// Runs the binary with `args` and `stdin`; its stdout, or a usage error with its
    /// stderr when it exits non-zero (or cannot run).
    fn ask(&self, args: &[&str], stdin: &str) -> ckpt_render::Result<String> {
        let usage = ckpt_render::Error::Usage;
        let shown = format!("--agent-binary {} {}", self.0.display(), args.join(" "));
        let mut child = Command::new(&self.0)
            .args(args)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| usage(format!("{shown}: cannot run it: {e}")))?;
        if let Some(mut input) = child.stdin.take() {
            // A binary that exits without reading says why on stderr; that is the error.
            let _ = input.write_all(stdin.as_bytes());
        }
        let output = child
            .wait_with_output()
            .map_err(|e| usage(format!("{shown}: {e}")))?;
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            let why = stderr.trim().trim_start_matches("pod-checkpointer: ");
            return Err(usage(format!("{shown}: {why} ({})", output.status)));
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }
}

impl AgentChecks for AgentBinary {
    fn strategies(&self) -> ckpt_render::Result<Vec<String>> {
        let listed = self.ask(&["strategies"], "")?;
        let names: Vec<String> = listed
            .lines()
            .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
            .collect();
        if names.is_empty() {
            return Err(ckpt_render::Error::Usage(format!(
                "--agent-binary {}: lists no strategies",
                self.0.display()
            )));
        }
        Ok(names)
    }

    fn check_config(&self, yaml: &str) -> ckpt_render::Result<()> {
        self.ask(&["check-config", "-"], yaml).map(drop)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A stand-in agent binary: a shell script that prints `strategies` for `strategies`
    /// and, for `check-config -`, reads stdin and accepts it when `accepts`, else says why
    /// on stderr and exits 2, as the agent does.
    pub(crate) fn fake_agent(dir: &Path, strategies: &str, accepts: bool) -> PathBuf {
        use std::os::unix::fs::PermissionsExt as _;
        let path = dir.join("pod-checkpointer");
        let check = if accepts {
            "cat > /dev/null; exit 0"
        } else {
            "cat > /dev/null; echo 'pod-checkpointer: --config: unknown field `gc-stratgy`' >&2; exit 2"
        };
        let script = format!(
            "#!/bin/sh\ncase \"$1\" in\n  strategies) printf '{strategies}' ;;\n  check-config) {check} ;;\n  *) exit 2 ;;\nesac\n"
        );
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    fn render_with(agent: &Path, strategy: &str) -> anyhow::Result<ckpt_render::ManifestOptions> {
        let args = ManifestArgs {
            gc_strategy: strategy.into(),
            ..ManifestArgs::default()
        };
        Ok(args.options_for(KubernetesVersion::NEWEST, &AgentBinary(agent.to_path_buf()))?)
    }

    #[test]
    fn an_agent_binary_is_asked_for_its_strategies_and_its_verdict_on_the_config() {
        let dir = tempfile::tempdir().unwrap();
        let agent = fake_agent(dir.path(), "keep-forever  keeps all\n", true);
        let options = render_with(&agent, "keep-forever").unwrap();
        assert!(options.agent_config().contains("gc-strategy: \"keep-forever\""));
        let error = render_with(&agent, "grace-period").unwrap_err().to_string();
        assert!(error.contains("registered strategies: keep-forever"), "{error}");

        let refusing = tempfile::tempdir().unwrap();
        let agent = fake_agent(refusing.path(), "keep-forever  keeps all\n", false);
        let error = render_with(&agent, "keep-forever").unwrap_err().to_string();
        assert!(error.contains("the agent would refuse this config"), "{error}");
        assert!(error.contains("unknown field `gc-stratgy`"), "{error}");

        let silent = tempfile::tempdir().unwrap();
        let agent = fake_agent(silent.path(), "", true);
        let error = render_with(&agent, "keep-forever").unwrap_err().to_string();
        assert!(error.contains("lists no strategies"), "{error}");

        let error = render_with(&dir.path().join("missing"), "keep-forever")
            .unwrap_err()
            .to_string();
        assert!(error.contains("cannot run it"), "{error}");
    }

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
