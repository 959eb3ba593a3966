//! Connection attempts per agent, counted on loopback by the kernel. Agent `i` reaches the
//! API server through its own port `base + i` of 127.0.0.1, which an iptables `nat` rule
//! of chain [`CHAIN`] redirects to the API server's port. NAT sees only the first packet
//! of a connection, so each rule's packet counter is that agent's connection attempts,
//! refused ones included (a SYN to a closed port is counted before the reset): nothing in
//! the agent or its traffic changes, and the API server's certificate names 127.0.0.1 as
//! before.

use std::io::Write;
use std::process::{Command, Stdio};

use anyhow::{Context, bail};

use crate::command::run_command;

/// The bench's own chain in the `nat` table.
const CHAIN: &str = "CKPT_FLEET";

/// The redirect rules of `agents` agents, removed again when dropped.
pub(crate) struct ConnectionCounter {
    base: u16,
    agents: usize,
}

impl ConnectionCounter {
    /// Redirects `127.0.0.1:(base + i)` to `127.0.0.1:apiserver_port` for `i` in
    /// `1..=agents`, replacing what an interrupted run left.
    pub(crate) fn install(
        base: u16,
        agents: usize,
        apiserver_port: u16,
    ) -> anyhow::Result<ConnectionCounter> {
        let last = port_of(base, agents)?;
        anyhow::ensure!(
            !(base..=last).contains(&apiserver_port),
            "the agents' ports {base}..={last} include the API server's {apiserver_port}"
        );
        remove_chain();
        let mut rules = format!(
            "*nat\n:{CHAIN} - [0:0]\n-A OUTPUT -d 127.0.0.1/32 -p tcp -m tcp --dport {}:{last} -j {CHAIN}\n",
            base + 1
        );
        for i in 1..=agents {
            rules.push_str(&format!(
                "-A {CHAIN} -d 127.0.0.1/32 -p tcp -m tcp --dport {} -j REDIRECT --to-ports {apiserver_port}\n",
                port_of(base, i)?
            ));
        }
        rules.push_str("COMMIT\n");
        let mut child = Command::new("iptables-restore")
            .arg("--noflush")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("cannot run iptables-restore")?;
        child
            .stdin
            .take()
            .context("iptables-restore has no stdin")?
            .write_all(rules.as_bytes())?;
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!(
                "iptables-restore failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(ConnectionCounter { base, agents })
    }

    /// The port agent `i` (from 1) connects to.
    pub(crate) fn port(&self, i: usize) -> anyhow::Result<u16> {
        port_of(self.base, i)
    }

    /// Each agent's connection attempts so far, agent 1 first.
    pub(crate) fn read(&self) -> anyhow::Result<Vec<u64>> {
        let listing =
            run_command(Command::new("iptables").args(["-w", "-t", "nat", "-L", CHAIN, "-n", "-v", "-x"]))?;
        let mut counts = vec![0; self.agents];
        for (port, packets) in parse_listing(&listing) {
            let i = usize::from(port.saturating_sub(self.base));
            if let Some(count) = i.checked_sub(1).and_then(|i| counts.get_mut(i)) {
                *count = packets;
            }
        }
        Ok(counts)
    }
}

impl Drop for ConnectionCounter {
    fn drop(&mut self) {
        remove_chain();
    }
}

fn port_of(base: u16, i: usize) -> anyhow::Result<u16> {
    u16::try_from(i)
        .ok()
        .and_then(|i| base.checked_add(i))
        .with_context(|| format!("agent {i}'s port is past 65535 (base {base})"))
}

/// Removes the jump and the chain, if there; errors are ignored (nothing to remove).
fn remove_chain() {
    let iptables = |args: &[&str]| {
        let _ = Command::new("iptables")
            .args(["-w", "-t", "nat"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    };
    // The jump's match is not known here (another run's ports): find it by its target.
    if let Ok(rules) = run_command(Command::new("iptables").args(["-w", "-t", "nat", "-S", "OUTPUT"])) {
        for rule in rules.lines().filter(|r| r.ends_with(&format!("-j {CHAIN}"))) {
            if let Some(spec) = rule.strip_prefix("-A OUTPUT ") {
                let mut args = vec!["-D", "OUTPUT"];
                args.extend(spec.split_whitespace());
                iptables(&args);
            }
        }
    }
    iptables(&["-F", CHAIN]);
    iptables(&["-X", CHAIN]);
}

/// `(destination port, packets)` of each REDIRECT rule in `iptables -L -n -v -x` output.
fn parse_listing(listing: &str) -> Vec<(u16, u64)> {
    listing
        .lines()
        .filter(|line| line.contains("REDIRECT"))
        .filter_map(|line| {
            let packets = line.split_whitespace().next()?.parse().ok()?;
            let port = line
                .split_whitespace()
                .find_map(|w| w.strip_prefix("dpt:"))?
                .parse()
                .ok()?;
            Some((port, packets))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_read_from_the_listing() {
        let check = |listing: &str, expected: &[(u16, u64)]| assert_eq!(parse_listing(listing), expected);
        check(
            "Chain CKPT_FLEET (1 references)\n    pkts      bytes target     prot opt in     out     source               destination\n\
             \x20      2      120 REDIRECT   6    --  *      *       0.0.0.0/0            127.0.0.1            tcp dpt:21001 redir ports 6443\n\
             \x20      0        0 REDIRECT   6    --  *      *       0.0.0.0/0            127.0.0.1            tcp dpt:21002 redir ports 6443\n",
            &[(21001, 2), (21002, 0)],
        );
        check("Chain CKPT_FLEET (0 references)\n", &[]);
        check("garbage REDIRECT without numbers\n", &[]);
    }

    #[test]
    fn ports_stay_in_range() {
        assert_eq!(port_of(21000, 1).unwrap(), 21001);
        assert!(port_of(65000, 600).is_err());
    }
}
