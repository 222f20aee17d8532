//! The encryption coverage report: which of a communicator's connections are protected how,
//! as the `Encryption coverage:` INFO line and the JSON of `ferrocclCommEncryptionReport`.
//!
//! Owns the report only; the facts come from `tls`'s connection registry (bootstrap and
//! socket connections by security) and from the communicator's connection table. It sits
//! above `comm` (it reads a communicator), so `comm` itself never logs it: the C API logs it
//! when a communicator is destroyed or aborted.

use crate::comm::Comm;
use crate::error::Result;
use crate::tls::{connections, rekeys, Channel, Owner, Security};

/// One communicator's connections by transport and protection: the facts behind the
/// `Encryption coverage:` INFO line and `ferrocclCommEncryptionReport`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Coverage {
    pub magic: u64,
    pub rank: usize,
    pub nranks: usize,
    /// Whether a pre-shared key is configured.
    pub encryption: bool,
    pub policy: crate::encryption::Policy,
    /// Bootstrap connections this rank made or accepted (opened since creation), by security.
    pub bootstrap: Vec<(Security, u64)>,
    /// Connections the unique-id root in this process accepted for this communicator.
    pub root: Vec<(Security, u64)>,
    /// Name of the network ("Socket").
    pub net: &'static str,
    /// Open network connections of this rank (sends + receives).
    pub net_conns: usize,
    /// Protection of the communicator's open data connections in this process.
    pub net_security: Vec<Security>,
    /// Open shared-memory connections of this rank (outside the TLS boundary).
    pub shm: usize,
    /// Ranks sharing the communicator's node area (collectives through shared memory,
    /// outside the TLS boundary); 0 when it has none.
    pub node_area_ranks: usize,
    /// TLS key updates on this communicator's connections in this process.
    pub rekeys: u64,
}

impl Coverage {
    /// Collects the facts for rank `rank` of communicator `magic`; `shm` and `net_conns` are
    /// its open connections per transport, from its connection table.
    pub fn collect(
        magic: u64,
        rank: usize,
        nranks: usize,
        net: &'static str,
        shm: usize,
        net_conns: usize,
    ) -> Coverage {
        let mut bootstrap: Vec<(Security, u64)> = Vec::new();
        let mut root: Vec<(Security, u64)> = Vec::new();
        let mut net_security: Vec<Security> = Vec::new();
        let add = |v: &mut Vec<(Security, u64)>, s: Security, n: u64| match v.iter_mut().find(|(x, _)| *x == s) {
            Some(e) => e.1 += n,
            None => v.push((s, n)),
        };
        for (owner, channel, security, counts) in connections(magic) {
            match (owner, channel) {
                (Owner::Rank(r), Channel::Bootstrap) if r as usize == rank => {
                    add(&mut bootstrap, security, counts.opened)
                }
                (Owner::Root, Channel::Bootstrap) => add(&mut root, security, counts.opened),
                (_, Channel::NetSocket) if counts.live > 0 && !net_security.contains(&security) => {
                    net_security.push(security)
                }
                _ => {}
            }
        }
        Coverage {
            magic,
            rank,
            nranks,
            encryption: crate::encryption::enabled(),
            policy: crate::encryption::policy(),
            bootstrap,
            root,
            net,
            net_conns,
            net_security,
            shm,
            node_area_ranks: 0,
            rekeys: rekeys(magic),
        }
    }

    /// The facts for a communicator (its connection table must not be in use by another
    /// thread at this moment).
    pub fn of(comm: &Comm) -> Result<Coverage> {
        let links = comm.links()?;
        let (shm, net) = links.connection_counts();
        let mut c = Self::collect(comm.magic, comm.rank, comm.nranks, links.net_name(), shm, net);
        c.node_area_ranks = if comm.node_area { comm.nranks } else { 0 };
        Ok(c)
    }

    /// Logs the `Encryption coverage:` INFO line for `comm` (at init and at destroy).
    pub fn log(comm: &Comm) {
        match Self::of(comm) {
            Ok(c) => log::info!(target: "INIT", "{}", c.line()),
            Err(e) => log::info!(target: "INIT", "Encryption coverage: not available now ({e})"),
        }
    }

    /// Connections of this rank that were not encrypted.
    pub fn plaintext(&self) -> u64 {
        let boot: u64 = self.bootstrap.iter().filter(|(s, _)| !s.is_encrypted()).map(|(_, n)| n).sum();
        let net = if self.net_security.iter().any(|s| !s.is_encrypted()) { self.net_conns as u64 } else { 0 };
        boot + net
    }

    fn list(v: &[(Security, u64)]) -> String {
        if v.is_empty() {
            return "0".into();
        }
        v.iter().map(|(s, n)| format!("{n} {s}")).collect::<Vec<_>>().join(" + ")
    }

    fn net_text(&self) -> String {
        let sec = match self.net_security.as_slice() {
            [] => String::new(),
            [one] => format!(" {one}"),
            many => format!(" {}", many.iter().map(|s| s.to_string()).collect::<Vec<_>>().join("|")),
        };
        format!("NET/{} {}{sec}", self.net, self.net_conns)
    }

    /// The INFO line.
    pub fn line(&self) -> String {
        let mut s = format!(
            "Encryption coverage: comm {:#018x} rank {}/{}: bootstrap {}",
            self.magic,
            self.rank,
            self.nranks,
            Self::list(&self.bootstrap)
        );
        if !self.root.is_empty() {
            s += &format!(", bootstrap root {}", Self::list(&self.root));
        }
        s += &format!(
            ", {}, SHM {} (outside TLS boundary), node area {} ranks{}; plaintext {}, rekeys {}, policy {}",
            self.net_text(),
            self.shm,
            self.node_area_ranks,
            if self.node_area_ranks > 0 { " (outside TLS boundary)" } else { "" },
            self.plaintext(),
            self.rekeys,
            self.policy
        );
        s
    }

    /// The same facts as one JSON object (for ferrocclCommEncryptionReport).
    pub fn json(&self) -> String {
        fn entries(v: &[(Security, u64)]) -> String {
            let items: Vec<String> = v.iter().map(|(s, n)| format!("{{\"count\":{n},{}}}", security_json(s))).collect();
            format!("[{}]", items.join(","))
        }
        fn security_json(s: &Security) -> String {
            match s {
                Security::Plain => "\"encrypted\":false,\"security\":\"plaintext\"".into(),
                Security::Tls { protocol, cipher, group } => format!(
                    "\"encrypted\":true,\"security\":\"{protocol}/{cipher}\",\"protocol\":\"{protocol}\",\
                     \"cipher\":\"{cipher}\",\"key_exchange\":\"psk_dhe_ke/{group}\""
                ),
            }
        }
        let net_sec: Vec<String> = self.net_security.iter().map(|s| format!("{{{}}}", security_json(s))).collect();
        format!(
            "{{\"comm\":\"{:#018x}\",\"rank\":{},\"nranks\":{},\"encryption\":\"{}\",\"policy\":\"{}\",\
             \"bootstrap\":{},\"bootstrap_root\":{},\
             \"net\":{{\"transport\":\"NET/{}\",\"count\":{},\"security\":[{}]}},\
             \"shm\":{{\"count\":{},\"encrypted\":false,\"note\":\"outside TLS boundary\"}},\
             \"node_area\":{{\"ranks\":{},\"encrypted\":false,\"note\":\"outside TLS boundary\"}},\
             \"plaintext\":{},\"rekeys\":{}}}",
            self.magic,
            self.rank,
            self.nranks,
            if self.encryption { "psk" } else { "none" },
            self.policy,
            entries(&self.bootstrap),
            entries(&self.root),
            self.net,
            self.net_conns,
            net_sec.join(","),
            self.shm,
            self.node_area_ranks,
            self.plaintext(),
            self.rekeys
        )
    }
}
