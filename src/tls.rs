//! TLS 1.3 with a pre-shared key for every TCP stream ferroccl owns, and the coverage
//! registry that proves it.
//!
//! Owns: the process-wide OpenSSL context (built once, at first use, from the key frozen by
//! `ncclSetEncryption`), the PSK derivation (HKDF-SHA256 with ferroccl's domain-separation
//! label), the TLS stream type [`TlsStream`] that `transport::socket::Stream` wraps, the
//! step-wise handshake [`MidHandshake`] for non-blocking sockets, TLS 1.3 key rotation, and
//! the registry of connections by communicator and security (which `crate::coverage` reports).
//!
//! Protocol (issue 4, NCCL 2.32 with ferroccl's own identity and label): TLS 1.3 only,
//! `TLS_AES_128_GCM_SHA256` only, external PSK through OpenSSL's PSK callbacks with identity
//! [`PSK_IDENTITY`], `psk_dhe_ke` (every connection gets fresh (EC)DHE traffic keys), no
//! certificates, no session tickets. After every handshake both sides check that the PSK
//! was used (`SSL_session_reused`), that (EC)DHE was negotiated, and the version and cipher;
//! anything else is dropped. The connecting side is the TLS client.
//!
//! Invariants: nothing here ever falls back to plaintext; failure to build the context is
//! `ncclSystemError`. Derived key copies are wiped ([`crate::encryption::wipe`]).
//!
//! The registry and [`Security`] exist in every build (plaintext connections are counted
//! too); the OpenSSL parts only with the `openssl3` feature.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

#[cfg(feature = "openssl3")]
pub use imp::*;

/// The PSK identity a client presents; the server rejects any other.
pub const PSK_IDENTITY: &str = "ferroccl-psk-v1";
/// HKDF `info` separating ferroccl's TLS key from other uses of the configured secret.
pub const PSK_DOMAIN_LABEL: &[u8] = b"ferroccl PSK domain separation v1";
/// The only cipher suite offered or accepted.
pub const CIPHER: &str = "TLS_AES_128_GCM_SHA256";
/// How the protocol version is reported.
pub const PROTOCOL: &str = "TLS1.3";
/// Largest TLS record payload (TLS 1.3, and OpenSSL's default max_send_fragment).
pub const RECORD_BYTES: usize = 16384;

/// How one connection is protected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Security {
    /// Plaintext TCP (only possible while no key is configured).
    Plain,
    /// A verified TLS session.
    Tls {
        protocol: &'static str,
        cipher: &'static str,
        /// The (EC)DHE group that made the traffic keys ("X25519", ...).
        group: &'static str,
    },
}

impl Security {
    pub fn is_encrypted(&self) -> bool {
        matches!(self, Security::Tls { .. })
    }
}

impl fmt::Display for Security {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Security::Plain => f.write_str("plaintext"),
            Security::Tls { protocol, cipher, .. } => write!(f, "{protocol}/{cipher}"),
        }
    }
}

/// Who a connection belongs to, for the per-communicator report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Owner {
    /// A rank of the communicator (bootstrap streams on both sides, data sends).
    Rank(u32),
    /// The unique-id root served from this process.
    Root,
    /// A data connection accepted by some local rank's listener (the listener does not know
    /// its rank; per-rank counts come from the communicator's connection table).
    Listener,
}

/// What a connection carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Channel {
    /// Unique-id rendezvous, bootstrap ring and bootstrap messages.
    Bootstrap,
    /// A socket of the socket transport.
    NetSocket,
    /// The setup connection of an InfiniBand connection (queue-pair details; the RDMA data
    /// itself never passes through it and is outside the TLS boundary).
    NetIb,
}

type Key = (u64, Owner, Channel, Security);

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Connections made since the process started.
    pub opened: u64,
    /// Connections open now.
    pub live: u64,
}

fn registry() -> MutexGuard<'static, HashMap<Key, Counts>> {
    static REGISTRY: OnceLock<Mutex<HashMap<Key, Counts>>> = OnceLock::new();
    REGISTRY.get_or_init(|| Mutex::new(HashMap::new())).lock().unwrap_or_else(|p| p.into_inner())
}

fn rekeys_by_magic() -> MutexGuard<'static, HashMap<u64, u64>> {
    static REKEYS: OnceLock<Mutex<HashMap<u64, u64>>> = OnceLock::new();
    REKEYS.get_or_init(|| Mutex::new(HashMap::new())).lock().unwrap_or_else(|p| p.into_inner())
}

static REKEYS_TOTAL: AtomicU64 = AtomicU64::new(0);

/// A connection's entry in the registry; dropping it marks the connection closed.
#[derive(Debug)]
pub struct Registration {
    key: Key,
}

impl Registration {
    pub fn magic(&self) -> u64 {
        self.key.0
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(c) = registry().get_mut(&self.key) {
            c.live = c.live.saturating_sub(1);
        }
    }
}

/// Records a new connection of communicator `magic`.
pub fn register(magic: u64, owner: Owner, channel: Channel, security: Security) -> Registration {
    let key = (magic, owner, channel, security);
    let mut reg = registry();
    let c = reg.entry(key).or_default();
    c.opened += 1;
    c.live += 1;
    Registration { key }
}

/// Every registry entry of communicator `magic`, sorted.
pub fn connections(magic: u64) -> Vec<(Owner, Channel, Security, Counts)> {
    let mut v: Vec<_> = registry().iter().filter(|(k, _)| k.0 == magic).map(|(k, c)| (k.1, k.2, k.3, *c)).collect();
    v.sort_by_key(|(o, ch, s, _)| (*o, *ch, s.to_string()));
    v
}

/// Forgets closed connections of `magic` (a communicator was destroyed; a later one may
/// reuse the magic, as NCCL_COMM_ID does).
pub fn forget(magic: u64) {
    registry().retain(|k, c| k.0 != magic || c.live > 0);
    rekeys_by_magic().remove(&magic);
}

/// TLS key updates sent by this process so far.
pub fn rekeys_total() -> u64 {
    REKEYS_TOTAL.load(Ordering::Relaxed)
}

/// TLS key updates sent on connections of communicator `magic`.
pub fn rekeys(magic: u64) -> u64 {
    rekeys_by_magic().get(&magic).copied().unwrap_or(0)
}

/// Counts `n` key updates sent on a connection of `magic` (if attributed).
#[cfg_attr(not(feature = "openssl3"), allow(dead_code))]
pub(crate) fn note_rekeys(magic: Option<u64>, n: u64) {
    if n == 0 {
        return;
    }
    REKEYS_TOTAL.fetch_add(n, Ordering::Relaxed);
    if let Some(m) = magic {
        *rekeys_by_magic().entry(m).or_default() += n;
    }
}

/// Bytes a data connection sends before it rotates its TLS keys (FERROCCL_TLS_REKEY_BYTES;
/// 0 disables rotation).
pub fn rekey_bytes() -> u64 {
    crate::env::get_bytes("FERROCCL_TLS_REKEY_BYTES")
}

#[cfg(feature = "openssl3")]
mod imp {
    //! The OpenSSL side.

    use std::io::{self, Read, Write};
    use std::net::{SocketAddr, TcpStream};
    use std::os::fd::{AsRawFd, RawFd};
    use std::sync::{Arc, OnceLock};

    use openssl::error::ErrorStack;
    use openssl::md::Md;
    use openssl::pkey::Id;
    use openssl::pkey_ctx::PkeyCtx;
    use openssl::ssl::{
        ErrorCode, Ssl, SslContext, SslContextBuilder, SslMethod, SslMode, SslOptions, SslRef, SslSessionCacheMode,
        SslStream, SslVerifyMode, SslVersion,
    };

    use super::{Security, CIPHER, PROTOCOL, PSK_DOMAIN_LABEL, PSK_IDENTITY};
    use crate::encryption::wipe;
    use crate::error::{Error, Result};

    /// Receive buffer of data connections: one recv() takes many records, which OpenSSL then
    /// reads one at a time. (OpenSSL's own read-ahead would do the recv() but moves the unread
    /// rest of its buffer to the front before every record: with a large buffer that is
    /// several times the data in memmove, 14% of an encrypted run's CPU time.)
    const READ_BUFFER: usize = 256 << 10;
    /// Write coalescing buffer of data connections: records leave in large send() calls.
    const WRITE_BUFFER: usize = 512 << 10;
    /// Buffered ciphertext that triggers an opportunistic send(). Large sends cost less
    /// system time per byte (2-core canary: 64 KiB 80 ms, 256 KiB 77 ms, 512 KiB 74 ms, the
    /// last within noise of 256 KiB and twice the buffer per connection).
    const WRITE_FLUSH_AT: usize = 256 << 10;

    /// TLS record header: type, legacy version, length (big-endian u16).
    const RECORD_HEADER: usize = 5;
    const SSL_KEY_UPDATE_NONE: libc::c_int = -1;
    const SSL_KEY_UPDATE_NOT_REQUESTED: libc::c_int = 0;
    const SSL_CTRL_GET_NEGOTIATED_GROUP: libc::c_int = 134;

    /// cbindgen:ignore
    /// Functions of libssl 3 that openssl-sys 0.9.118 does not declare (libssl is linked by
    /// openssl-sys already). In their own module so they stay out of nccl.h.
    mod libssl {
        extern "C" {
            pub fn SSL_key_update(s: *mut openssl_sys::SSL, updatetype: libc::c_int) -> libc::c_int;
            pub fn SSL_get_key_update_type(s: *const openssl_sys::SSL) -> libc::c_int;
        }
    }
    use libssl::{SSL_get_key_update_type, SSL_key_update};

    /// The raw `SSL*` behind a reference.
    fn raw(ssl: &SslRef) -> *mut openssl_sys::SSL {
        // foreign-types 0.3 (openssl's wrapper scheme): a `&SslRef` *is* a pointer to the C
        // `SSL` object (ForeignTypeRef::as_ptr is this cast).
        ssl as *const SslRef as *mut openssl_sys::SSL
    }

    /// A 32-byte key, wiped on drop.
    pub struct DerivedKey([u8; 32]);

    impl DerivedKey {
        pub fn bytes(&self) -> &[u8; 32] {
            &self.0
        }
    }

    impl Drop for DerivedKey {
        fn drop(&mut self) {
            wipe(&mut self.0);
        }
    }

    fn openssl_error(what: &str, e: ErrorStack) -> Error {
        Error::system(format!("OpenSSL: {what}"), io::Error::other(e.to_string()))
    }

    /// HKDF-SHA256 (RFC 5869, no salt) of `ikm` with `info`, `out.len()` bytes, by OpenSSL.
    pub fn hkdf_sha256(ikm: &[u8], info: &[u8], out: &mut [u8]) -> std::result::Result<(), ErrorStack> {
        let mut ctx = PkeyCtx::new_id(Id::HKDF)?;
        ctx.derive_init()?;
        ctx.set_hkdf_md(Md::sha256())?;
        ctx.set_hkdf_key(ikm)?;
        ctx.add_hkdf_info(info)?;
        ctx.derive(Some(out))?;
        Ok(())
    }

    /// The TLS PSK for a configured key: HKDF-SHA256(ikm = key, no salt, info = label).
    pub fn derive_psk(configured: &[u8]) -> Result<DerivedKey> {
        let mut key = DerivedKey([0u8; 32]);
        hkdf_sha256(configured, PSK_DOMAIN_LABEL, &mut key.0).map_err(|e| openssl_error("HKDF", e))?;
        Ok(key)
    }

    /// The client and server contexts for one key. (Separate because a server needs a
    /// session id context while a client's PSK session must have none: OpenSSL refuses to
    /// "reuse session in different context" otherwise.)
    pub struct Contexts {
        client: SslContext,
        server: SslContext,
    }

    impl Contexts {
        fn get(&self, role: Role) -> &SslContext {
            match role {
                Role::Client => &self.client,
                Role::Server => &self.server,
            }
        }
    }

    /// Builds the contexts for `configured` (the key given to ncclSetEncryption).
    pub fn new_context(configured: &[u8]) -> Result<Contexts> {
        let key = Arc::new(derive_psk(configured)?);
        Ok(Contexts { client: build(key.clone(), Role::Client)?, server: build(key, Role::Server)? })
    }

    fn build(key: Arc<DerivedKey>, role: Role) -> Result<SslContext> {
        let e = |what: &'static str| move |err: ErrorStack| openssl_error(what, err);
        let mut b = SslContextBuilder::new(SslMethod::tls()).map_err(e("SSL_CTX_new"))?;
        b.set_min_proto_version(Some(SslVersion::TLS1_3)).map_err(e("min protocol"))?;
        b.set_max_proto_version(Some(SslVersion::TLS1_3)).map_err(e("max protocol"))?;
        b.set_ciphersuites(CIPHER).map_err(e("ciphersuites"))?;
        // No tickets, no session cache: every connection runs a full PSK + (EC)DHE handshake.
        // SSL_OP_ALLOW_NO_DHE_KEX stays clear (psk_dhe_ke only).
        b.set_options(SslOptions::NO_TICKET | SslOptions::NO_COMPRESSION);
        b.set_num_tickets(0).map_err(e("num_tickets"))?;
        b.set_session_cache_mode(SslSessionCacheMode::OFF);
        // No certificates exist: a handshake that does not use the PSK cannot authenticate
        // and fails (the client verifies, as NCCL's does).
        b.set_verify(SslVerifyMode::PEER);
        // Non-blocking data path: a write returns after each record; a retried write may come
        // from a moved buffer of the same contents.
        b.set_mode(SslMode::ENABLE_PARTIAL_WRITE | SslMode::ACCEPT_MOVING_WRITE_BUFFER);
        // No read-ahead: OpenSSL asks for exactly one record header and then its body, which
        // data connections serve from TlsIo's receive buffer.
        match role {
            Role::Client => b.set_psk_client_callback(move |_ssl, _hint, identity, psk| {
                let id = PSK_IDENTITY.as_bytes();
                if identity.len() < id.len() + 1 || psk.len() < 32 {
                    return Ok(0);
                }
                identity[..id.len()].copy_from_slice(id);
                identity[id.len()] = 0;
                psk[..32].copy_from_slice(key.bytes());
                Ok(32)
            }),
            Role::Server => {
                // Needed by servers with SSL_VERIFY_PEER (see build notes).
                b.set_session_id_context(b"ferroccl").map_err(e("session id context"))?;
                b.set_psk_server_callback(move |_ssl, identity, psk| {
                    if identity != Some(PSK_IDENTITY.as_bytes()) || psk.len() < 32 {
                        log::warn!(
                            target: "NET",
                            "TLS: rejected a client presenting PSK identity {:?} (expected {PSK_IDENTITY:?})",
                            identity.map(String::from_utf8_lossy)
                        );
                        return Ok(0);
                    }
                    psk[..32].copy_from_slice(key.bytes());
                    Ok(32)
                })
            }
        }
        Ok(b.build())
    }

    /// The process's contexts, built at first use from the frozen key.
    pub fn context() -> Result<&'static Contexts> {
        static CONTEXT: OnceLock<std::result::Result<Contexts, String>> = OnceLock::new();
        crate::encryption::freeze();
        let ctx = CONTEXT.get_or_init(|| {
            crate::encryption::with_psk(|psk| match psk {
                Some(k) => {
                    // Which libcrypto does the AES-GCM matters for speed (OpenSSL 3.0 has no
                    // VAES/AVX-512 code path; later 3.x releases do), so operators see it.
                    log::info!(
                        target: "INIT",
                        "TLS: {} ({PROTOCOL} {CIPHER}, pre-shared key with (EC)DHE)",
                        openssl::version::version()
                    );
                    new_context(k).map_err(|e| e.to_string())
                }
                None => Err("no pre-shared key is configured".into()),
            })
        });
        match ctx {
            Ok(c) => Ok(c),
            Err(msg) => Err(Error::system(
                "initialising TLS (OpenSSL); refusing to communicate unencrypted",
                io::Error::other(msg.clone()),
            )),
        }
    }

    /// The TCP stream under OpenSSL. Data connections batch both ways: many records per
    /// send() (write coalescing) and per recv() (the receive buffer).
    pub struct TlsIo {
        tcp: TcpStream,
        wbuf: Vec<u8>,
        wpos: usize,
        coalesce: bool,
        /// Received ciphertext not yet taken by OpenSSL is `rbuf[rpos..rlen]`; empty `rbuf`:
        /// no buffering (handshakes and control connections read exactly what OpenSSL asks).
        rbuf: Vec<u8>,
        rpos: usize,
        rlen: usize,
    }

    impl TlsIo {
        fn new(tcp: TcpStream) -> TlsIo {
            TlsIo { tcp, wbuf: Vec::new(), wpos: 0, coalesce: false, rbuf: Vec::new(), rpos: 0, rlen: 0 }
        }

        /// A whole record waits in the receive buffer. OpenSSL takes a record's header and
        /// body whole whenever they are buffered, so `rpos` is at a record boundary whenever
        /// bytes remain.
        fn record_buffered(&self) -> bool {
            let b = &self.rbuf[self.rpos..self.rlen];
            b.len() >= RECORD_HEADER && b.len() - RECORD_HEADER >= u16::from_be_bytes([b[3], b[4]]) as usize
        }

        fn unflushed(&self) -> bool {
            self.wpos < self.wbuf.len()
        }

        /// Sends buffered ciphertext until done or the socket is full (WouldBlock).
        fn drain(&mut self) -> io::Result<()> {
            while self.wpos < self.wbuf.len() {
                match self.tcp.write(&self.wbuf[self.wpos..]) {
                    Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                    Ok(n) => self.wpos += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            self.wbuf.clear();
            self.wpos = 0;
            Ok(())
        }
    }

    impl Read for TlsIo {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if self.rpos == self.rlen {
                if self.rbuf.is_empty() {
                    return self.tcp.read(buf);
                }
                // Empty: refill with one recv() (WouldBlock and EOF pass through, leaving the
                // buffer empty, so a caller that saw WouldBlock may sleep in poll()).
                let n = self.tcp.read(&mut self.rbuf)?;
                (self.rpos, self.rlen) = (0, n);
            }
            let n = buf.len().min(self.rlen - self.rpos);
            buf[..n].copy_from_slice(&self.rbuf[self.rpos..self.rpos + n]);
            self.rpos += n;
            Ok(n)
        }
    }

    impl Write for TlsIo {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if !self.coalesce {
                return self.tcp.write(buf);
            }
            if self.wbuf.len() + buf.len() > WRITE_BUFFER {
                // Short of room: send what is buffered if that is what it takes, then move
                // the unsent rest to the front (sent bytes before `wpos` count as room).
                if self.wbuf.len() - self.wpos + buf.len() > WRITE_BUFFER {
                    match self.drain() {
                        Ok(()) => {}
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                        Err(e) => return Err(e),
                    }
                }
                if self.wpos > 0 {
                    self.wbuf.drain(..self.wpos);
                    self.wpos = 0;
                }
            }
            let room = WRITE_BUFFER.saturating_sub(self.wbuf.len());
            if room == 0 {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            if self.wbuf.capacity() == 0 {
                self.wbuf.reserve_exact(WRITE_BUFFER);
            }
            let n = room.min(buf.len());
            self.wbuf.extend_from_slice(&buf[..n]);
            if self.wbuf.len() - self.wpos >= WRITE_FLUSH_AT {
                match self.drain() {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(n)
        }

        fn flush(&mut self) -> io::Result<()> {
            self.drain()
        }
    }

    /// Which side of the handshake.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Role {
        /// The connecting side.
        Client,
        /// The accepting side.
        Server,
    }

    /// A handshake in progress (blocking or not, depending on the socket).
    pub struct MidHandshake {
        ssl: SslStream<TlsIo>,
        role: Role,
        peer: SocketAddr,
        wants_write: bool,
    }

    impl MidHandshake {
        /// Starts a handshake over `tcp` with the process's context.
        pub fn start(tcp: TcpStream, role: Role, peer: SocketAddr) -> Result<MidHandshake> {
            Self::start_with(context()?, tcp, role, peer)
        }

        /// Starts a handshake with an explicit context (tests use their own keys).
        pub fn start_with(ctx: &Contexts, tcp: TcpStream, role: Role, peer: SocketAddr) -> Result<MidHandshake> {
            let mut ssl = Ssl::new(ctx.get(role)).map_err(|e| openssl_error("SSL_new", e))?;
            match role {
                Role::Client => ssl.set_connect_state(),
                Role::Server => ssl.set_accept_state(),
            }
            let ssl = SslStream::new(ssl, TlsIo::new(tcp)).map_err(|e| openssl_error("SSL_set_bio", e))?;
            Ok(MidHandshake { ssl, role, peer, wants_write: false })
        }

        pub fn fd(&self) -> RawFd {
            self.ssl.get_ref().tcp.as_raw_fd()
        }

        pub fn tcp(&self) -> &TcpStream {
            &self.ssl.get_ref().tcp
        }

        pub fn peer(&self) -> SocketAddr {
            self.peer
        }

        /// Whether the last step waited for the socket to become writable (else readable).
        pub fn wants_write(&self) -> bool {
            self.wants_write
        }

        /// Advances the handshake: `Ok(true)` when it is complete, `Ok(false)` when it waits
        /// for the socket (non-blocking) or a blocking read/write timed out.
        pub fn step(&mut self) -> Result<bool> {
            match self.ssl.do_handshake() {
                Ok(()) => Ok(true),
                Err(e) if e.code() == ErrorCode::WANT_READ => {
                    self.wants_write = false;
                    Ok(false)
                }
                Err(e) if e.code() == ErrorCode::WANT_WRITE => {
                    self.wants_write = true;
                    Ok(false)
                }
                Err(e) => Err(handshake_error(self.role, self.peer, &e)),
            }
        }

        /// Checks what was negotiated and returns the stream (errors drop the connection).
        pub fn finish(self) -> Result<TlsStream> {
            let security = verify(self.ssl.ssl())
                .map_err(|why| Error::remote(format!("TLS connection with {} rejected: {why}", self.peer)))?;
            Ok(TlsStream { ssl: self.ssl, security, rekey_after: 0, since_rekey: 0, rekey_scheduled: false, rekeys: 0 })
        }
    }

    fn handshake_error(role: Role, peer: SocketAddr, e: &openssl::ssl::Error) -> Error {
        let detail = match (e.io_error(), e.ssl_error()) {
            (Some(io), _) => io.to_string(),
            (None, Some(stack)) => stack.to_string(),
            (None, None) if e.code() == ErrorCode::SYSCALL || e.code() == ErrorCode::ZERO_RETURN => {
                "connection closed by the peer".into()
            }
            (None, None) => e.to_string(),
        };
        let hint = match role {
            Role::Client => "do all ranks use the same pre-shared key (ncclSetEncryption) and a TLS-enabled build?",
            Role::Server => "plaintext peer, garbage, or a different pre-shared key",
        };
        Error::remote(format!("TLS handshake with {peer} failed ({detail}); {hint}"))
    }

    /// The negotiated session is what issue 4 requires, or why not.
    fn verify(ssl: &SslRef) -> std::result::Result<Security, String> {
        if ssl.version2() != Some(SslVersion::TLS1_3) {
            return Err(format!("protocol {} is not TLS 1.3", ssl.version_str()));
        }
        let cipher = ssl.current_cipher().map(|c| c.name()).unwrap_or("none");
        if cipher != CIPHER {
            return Err(format!("cipher {cipher} is not {CIPHER}"));
        }
        // With an external PSK, OpenSSL reports the PSK session as reused.
        if !ssl.session_reused() {
            return Err("the handshake did not use the pre-shared key".into());
        }
        if ssl.peer_certificate().is_some() {
            return Err("the peer presented a certificate (PSK only)".into());
        }
        // SAFETY: a valid SSL*; SSL_ctrl(GET_NEGOTIATED_GROUP) only reads the session.
        let nid = unsafe { openssl_sys::SSL_ctrl(raw(ssl), SSL_CTRL_GET_NEGOTIATED_GROUP, 0, std::ptr::null_mut()) };
        if nid <= 0 {
            return Err("no (EC)DHE key exchange (psk_ke without forward secrecy is refused)".into());
        }
        let group = openssl::nid::Nid::from_raw(nid as libc::c_int).short_name().unwrap_or("unknown group");
        Ok(Security::Tls { protocol: PROTOCOL, cipher: CIPHER, group })
    }

    /// A verified TLS session over TCP.
    pub struct TlsStream {
        ssl: SslStream<TlsIo>,
        security: Security,
        rekey_after: u64,
        since_rekey: u64,
        rekey_scheduled: bool,
        rekeys: u64,
    }

    impl TlsStream {
        pub fn tcp(&self) -> &TcpStream {
            &self.ssl.get_ref().tcp
        }

        pub fn security(&self) -> Security {
            self.security
        }

        /// Sending side of a data connection: records leave in large send() calls; the caller
        /// must then call [`TlsStream::flush_pending`] until it succeeds before waiting for its
        /// peer.
        pub fn batch_writes(&mut self) {
            self.ssl.get_mut().coalesce = true;
        }

        /// Receiving side of a data connection: records arrive through a receive buffer, many
        /// per recv(). Call between reads only (what OpenSSL read so far was exact).
        pub fn batch_reads(&mut self) {
            let io = self.ssl.get_mut();
            if io.rbuf.is_empty() {
                io.rbuf = vec![0; READ_BUFFER];
            }
        }

        /// Rotates the sending keys after this many bytes (0: never).
        pub fn set_rekey_after(&mut self, bytes: u64) {
            self.rekey_after = bytes;
        }

        /// Decrypted or received input is waiting in user space (poll() on the fd would not
        /// show it).
        pub fn pending(&self) -> bool {
            // Decrypted bytes, or a whole record in the receive buffer (a partial one needs the
            // socket).
            self.ssl.ssl().pending() > 0 || self.ssl.get_ref().record_buffered()
        }

        /// Ciphertext waits in the coalescing buffer.
        pub fn unflushed(&self) -> bool {
            self.ssl.get_ref().unflushed()
        }

        /// Sends buffered ciphertext; WouldBlock while the socket is full.
        pub fn flush_pending(&mut self) -> io::Result<()> {
            self.ssl.get_mut().drain()
        }

        /// Key updates sent since the last call.
        pub fn take_rekeys(&mut self) -> u64 {
            std::mem::take(&mut self.rekeys)
        }

        pub fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if buf.is_empty() {
                return Ok(0);
            }
            // Post-handshake records (KeyUpdate) yield WANT_READ without data: try again.
            for _ in 0..16 {
                match self.ssl.ssl_read(buf) {
                    Ok(n) => return Ok(n),
                    Err(e) => match e.code() {
                        ErrorCode::ZERO_RETURN => return Ok(0),
                        ErrorCode::WANT_READ | ErrorCode::WANT_WRITE if e.io_error().is_none() => {}
                        ErrorCode::WANT_READ | ErrorCode::WANT_WRITE | ErrorCode::SYSCALL => {
                            return match e.into_io_error() {
                                Ok(io) => Err(io),
                                Err(_) => Ok(0), // EOF without close_notify
                            };
                        }
                        _ => return Err(ssl_io_error(e)),
                    },
                }
            }
            Err(io::ErrorKind::WouldBlock.into())
        }

        pub fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if buf.is_empty() {
                return Ok(0);
            }
            match self.ssl.ssl_write(buf) {
                Ok(n) => {
                    self.after_write(n as u64)?;
                    Ok(n)
                }
                Err(e) => match e.code() {
                    ErrorCode::WANT_READ | ErrorCode::WANT_WRITE if e.io_error().is_none() => {
                        Err(io::ErrorKind::WouldBlock.into())
                    }
                    ErrorCode::WANT_READ | ErrorCode::WANT_WRITE | ErrorCode::SYSCALL => {
                        Err(e.into_io_error().unwrap_or_else(|_| io::ErrorKind::BrokenPipe.into()))
                    }
                    ErrorCode::ZERO_RETURN => Err(io::ErrorKind::BrokenPipe.into()),
                    _ => Err(ssl_io_error(e)),
                },
            }
        }

        /// Counts sent bytes and schedules a TLS 1.3 KeyUpdate when the budget is spent. The
        /// update is sent in front of the next record (no write is pending at this point, as
        /// SSL_key_update requires).
        fn after_write(&mut self, n: u64) -> io::Result<()> {
            let ssl = raw(self.ssl.ssl());
            // SAFETY: a valid, connected SSL*.
            if self.rekey_scheduled && unsafe { SSL_get_key_update_type(ssl) } == SSL_KEY_UPDATE_NONE {
                self.rekey_scheduled = false;
                self.rekeys += 1;
                log::debug!(target: "NET", "NET/Socket : TLS key update sent to {:?}", self.tcp().peer_addr().ok());
            }
            self.since_rekey += n;
            if self.rekey_after > 0 && self.since_rekey >= self.rekey_after && !self.rekey_scheduled {
                // NOT_REQUESTED: our data connections carry bytes one way; the receiver never
                // writes, and a requested update would make it write a KeyUpdate into a socket
                // nobody reads (unread data turns the sender's close into a RST).
                // SAFETY: a valid SSL* after its handshake, with no write pending (the last
                // SSL_write succeeded).
                if unsafe { SSL_key_update(ssl, SSL_KEY_UPDATE_NOT_REQUESTED) } != 1 {
                    let stack = ErrorStack::get();
                    return Err(io::Error::other(format!("TLS key update failed: {stack}")));
                }
                self.rekey_scheduled = true;
                self.since_rekey = 0;
            }
            Ok(())
        }
    }

    fn ssl_io_error(e: openssl::ssl::Error) -> io::Error {
        let text = e.to_string();
        let kind =
            if text.contains("unexpected eof") { io::ErrorKind::UnexpectedEof } else { io::ErrorKind::InvalidData };
        io::Error::new(kind, format!("TLS: {text}"))
    }

    #[cfg(test)]
    mod tests {
        use std::net::TcpListener;
        use std::time::{Duration, Instant};

        use super::*;

        fn hex(s: &str) -> Vec<u8> {
            (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
        }

        #[test]
        fn hkdf_matches_rfc5869_case_3() {
            // RFC 5869 A.3: SHA-256, zero-length salt and info.
            let mut okm = [0u8; 42];
            hkdf_sha256(&[0x0b; 22], b"", &mut okm).unwrap();
            assert_eq!(
                okm.to_vec(),
                hex("8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d9d201395faa4b61a96c8")
            );
            // The label changes the key.
            let a = derive_psk(&[7u8; 32]).unwrap();
            let mut b = [0u8; 32];
            hkdf_sha256(&[7u8; 32], b"", &mut b).unwrap();
            assert_ne!(a.bytes(), &b);
        }

        /// A blocking handshake pair over loopback with the given contexts.
        fn pair(client: &Contexts, server: &'static Contexts) -> (Result<TlsStream>, Result<TlsStream>) {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = l.local_addr().unwrap();
            let t = std::thread::spawn(move || {
                let (tcp, peer) = l.accept().unwrap();
                tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                let mut hs = MidHandshake::start_with(server, tcp, Role::Server, peer)?;
                while !hs.step()? {}
                hs.finish()
            });
            let tcp = TcpStream::connect(addr).unwrap();
            tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let c = (|| {
                let mut hs = MidHandshake::start_with(client, tcp, Role::Client, addr)?;
                let deadline = Instant::now() + Duration::from_secs(5);
                while !hs.step()? {
                    assert!(Instant::now() < deadline);
                }
                hs.finish()
            })();
            (c, t.join().unwrap())
        }

        fn leak(ctx: Contexts) -> &'static Contexts {
            Box::leak(Box::new(ctx))
        }

        #[test]
        fn psk_handshake_negotiates_what_we_require_and_moves_data() {
            let ctx = leak(new_context(&[42u8; 40]).unwrap());
            let (c, s) = pair(ctx, ctx);
            let (mut c, mut s) = (c.unwrap(), s.unwrap());
            match c.security() {
                Security::Tls { protocol, cipher, group } => {
                    assert_eq!((protocol, cipher), ("TLS1.3", "TLS_AES_128_GCM_SHA256"));
                    assert!(!group.is_empty());
                }
                other => panic!("{other:?}"),
            }
            assert_eq!(c.security(), s.security());
            c.set_rekey_after(1000);
            let data: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
            let mut sent = 0;
            while sent < data.len() {
                sent += c.write(&data[sent..]).unwrap();
            }
            let mut got = vec![0u8; data.len()];
            let mut n = 0;
            while n < got.len() {
                n += s.read(&mut got[n..]).unwrap();
            }
            assert_eq!(got, data);
            // Records are 16 KiB and every write > 1000 bytes schedules an update that the next
            // record carries.
            assert!(c.take_rekeys() >= 4);
        }

        #[test]
        fn batched_connection_moves_data_and_reports_buffered_records() {
            let ctx = leak(new_context(&[7u8; 40]).unwrap());
            let (c, s) = pair(ctx, ctx);
            let (mut c, mut s) = (c.unwrap(), s.unwrap());
            c.batch_writes();
            s.batch_reads();
            // Two small records in one send(), then bulk data crossing many records.
            let bulk: Vec<u8> = (0..300_000u32).map(|i| (i * 7) as u8).collect();
            assert_eq!(c.write(b"first").unwrap(), 5);
            assert_eq!(c.write(b"second").unwrap(), 6);
            assert!(c.unflushed(), "coalesced records wait for flush_pending");
            c.flush_pending().unwrap();
            let mut first = [0u8; 5];
            let mut n = 0;
            while n < 5 {
                n += s.read(&mut first[n..]).unwrap();
            }
            assert_eq!(&first, b"first");
            // The second record was received with the first and sits in TlsIo's buffer, not
            // in the socket: poll() would not show it, so pending() must.
            assert!(s.pending(), "a whole record waits in the receive buffer");
            let mut second = [0u8; 6];
            let mut n = 0;
            while n < 6 {
                n += s.read(&mut second[n..]).unwrap();
            }
            assert_eq!(&second, b"second");
            assert!(!s.pending());
            let writer = std::thread::spawn(move || {
                let mut sent = 0;
                while sent < bulk.len() {
                    sent += c.write(&bulk[sent..]).unwrap();
                }
                c.flush_pending().unwrap();
                (c, bulk)
            });
            let mut got = vec![0u8; 300_000];
            let mut n = 0;
            while n < got.len() {
                n += s.read(&mut got[n..]).unwrap();
            }
            let (_c, bulk) = writer.join().unwrap();
            assert_eq!(got, bulk);
        }

        #[test]
        fn wrong_key_fails_on_both_sides() {
            let a = new_context(&[1u8; 32]).unwrap();
            let b = leak(new_context(&[2u8; 32]).unwrap());
            let (c, s) = pair(&a, b);
            let (ce, se) = (c.err().unwrap().to_string(), s.err().unwrap().to_string());
            assert!(ce.contains("TLS handshake"), "{ce}");
            assert!(se.contains("TLS handshake"), "{se}");
        }

        #[test]
        fn plaintext_client_fails_the_server_handshake() {
            let ctx = leak(new_context(&[3u8; 32]).unwrap());
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = l.local_addr().unwrap();
            let t = std::thread::spawn(move || {
                let (tcp, peer) = l.accept().unwrap();
                tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                let mut hs = MidHandshake::start_with(ctx, tcp, Role::Server, peer)?;
                while !hs.step()? {}
                hs.finish().map(|_| ())
            });
            let mut tcp = TcpStream::connect(addr).unwrap();
            tcp.write_all(&[0x6c, 0x9d, 0x4b, 0xfc, 0xf2, 0xb9, 0x4a, 0x56, 4, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0])
                .unwrap();
            let e = t.join().unwrap().unwrap_err().to_string();
            assert!(e.contains("TLS handshake"), "{e}");
        }
    }
}
