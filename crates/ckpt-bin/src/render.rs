//! `pod-checkpointer render`: the install manifests of [`ckpt_render`], checked against
//! this program's own strategy registry and config parser ([`BuiltIn`]), so a config the
//! agent would refuse never reaches a cluster.

use ckpt_render::{AgentChecks, KubernetesVersion, ManifestArgs, ManifestOptions};

use crate::config::check_config_file;

/// The registry and config parser linked into this program: a custom agent binary (one
/// with extra strategy crates) checks what it knows.
#[derive(Clone, Copy, Debug, Default)]
pub struct BuiltIn;

impl AgentChecks for BuiltIn {
    fn strategies(&self) -> ckpt_render::Result<Vec<String>> {
        Ok(ckpt_gc::names().into_iter().map(str::to_owned).collect())
    }

    fn check_config(&self, yaml: &str) -> ckpt_render::Result<()> {
        // `options_for` words the refusal (the agent's message, cause and all, on one line).
        check_config_file(yaml)
            .map(drop)
            .map_err(|e| ckpt_render::Error::Usage(ckpt_core::error_chain(&e)))
    }
}

/// [`ManifestArgs::options_for`] this program's agent ([`BuiltIn`]).
pub trait BuiltInOptions {
    /// Checks the flags the way this program's agent will check its config, before
    /// anything is rendered or sent; `version` stands in when `--kubernetes-version` is not
    /// given.
    fn options(&self, version: KubernetesVersion) -> ckpt_render::Result<ManifestOptions>;
}

impl BuiltInOptions for ManifestArgs {
    fn options(&self, version: KubernetesVersion) -> ckpt_render::Result<ManifestOptions> {
        self.options_for(version, &BuiltIn)
    }
}

#[cfg(test)]
mod tests;
