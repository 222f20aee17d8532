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
    /// Protection of the communicator's open data connections in this process (socket
    /// transport), or of the setup connections of its IB connections (IB: the RDMA data
    /// itself is never encrypted).
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
        // IB: the setup sockets are what TLS covers; the RDMA data is outside it.
        let data_channel = if net == "IB" { Channel::NetIb } else { Channel::NetSocket };
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
                (_, c) if c == data_channel && counts.live > 0 && !net_security.contains(&security) => {
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

    /// Whether the network's data bypasses TLS whatever the sockets do (RDMA).
    pub fn net_data_outside_tls(&self) -> bool {
        self.net == "IB"
    }

    /// Connections of this rank that were not encrypted (every IB connection: its data is
    /// RDMA, outside TLS).
    pub fn plaintext(&self) -> u64 {
        let boot: u64 = self.bootstrap.iter().filter(|(s, _)| !s.is_encrypted()).map(|(_, n)| n).sum();
        let net = if self.net_data_outside_tls() || self.net_security.iter().any(|s| !s.is_encrypted()) {
            self.net_conns as u64
        } else {
            0
        };
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
        if self.net_data_outside_tls() {
            let setup = if sec.is_empty() { String::new() } else { format!("; setup{sec}") };
            return format!("NET/{} {} (RDMA data outside TLS boundary{setup})", self.net, self.net_conns);
        }
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
             \"net\":{{\"transport\":\"NET/{}\",\"count\":{},\"security\":[{}]{}}},\
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
            if self.net_data_outside_tls() {
                ",\"data\":{\"encrypted\":false,\"note\":\"RDMA, outside TLS boundary; security is the setup connections'\"}"
            } else {
                ""
            },
            self.shm,
            self.node_area_ranks,
            self.plaintext(),
            self.rekeys
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encryption::Policy;

    fn sample(net: &'static str, net_security: Vec<Security>) -> Coverage {
        Coverage {
            magic: 0x1234,
            rank: 0,
            nranks: 2,
            encryption: true,
            policy: Policy::Default,
            bootstrap: vec![(Security::Tls { protocol: "TLS1.3", cipher: "X", group: "Y" }, 2)],
            root: vec![],
            net,
            net_conns: 2,
            net_security,
            shm: 0,
            node_area_ranks: 0,
            rekeys: 0,
        }
    }

    #[test]
    fn ib_data_is_reported_outside_the_tls_boundary() {
        let tls = Security::Tls { protocol: "TLS1.3", cipher: "TLS_AES_128_GCM_SHA256", group: "X25519" };
        let c = sample("IB", vec![tls]);
        let line = c.line();
        assert!(
            line.contains("NET/IB 2 (RDMA data outside TLS boundary; setup TLS1.3/TLS_AES_128_GCM_SHA256)"),
            "{line}"
        );
        assert!(line.contains("plaintext 2,"), "the RDMA data counts as plaintext: {line}");
        let json = c.json();
        assert!(json.contains("\"data\":{\"encrypted\":false,\"note\":\"RDMA, outside TLS boundary"), "{json}");
        // Sockets under TLS: nothing outside it, no data note.
        let c = sample("Socket", vec![tls]);
        assert!(c.line().contains("NET/Socket 2 TLS1.3/TLS_AES_128_GCM_SHA256,"), "{}", c.line());
        assert!(c.line().contains("plaintext 0,"), "{}", c.line());
        assert!(!c.json().contains("\"data\""));
    }
}
