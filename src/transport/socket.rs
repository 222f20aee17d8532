//! TCP building blocks shared by the bootstrap and the socket transport: listening on the
//! chosen interface, connecting with NCCL's retry rules, the hello every connection starts
//! with, and blocking length-prefixed messages for setup traffic.
//!
//! Every byte ferroccl sends over TCP goes through [`Stream`], so that encryption (TLS) wraps
//! all of it in one place.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::interrupt::Interrupt;
use crate::tls;
pub use crate::wire::{decode_addr, encode_addr, ConnKind, Hello, ADDR_BYTES, HELLO_BYTES};

/// Coverage classes of the hello's connection kinds (the kinds themselves are `wire`'s).
impl ConnKind {
    /// The coverage class of a connection of this kind.
    pub fn channel(self) -> tls::Channel {
        match self {
            ConnKind::Root | ConnKind::Ring | ConnKind::BootstrapP2p => tls::Channel::Bootstrap,
            ConnKind::Data => tls::Channel::NetSocket,
            ConnKind::IbSetup => tls::Channel::NetIb,
        }
    }
}

/// How long setup steps wait for peers (FERROCCL_BOOTSTRAP_TIMEOUT seconds): connecting,
/// handshakes, the bootstrap (which re-exports this as `bootstrap::timeout`).
pub fn setup_timeout() -> Duration {
    static TIMEOUT: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *TIMEOUT.get_or_init(|| Duration::from_secs(crate::env::get_int("FERROCCL_BOOTSTRAP_TIMEOUT").max(1) as u64))
}

/// How long a peer's kernel may stay silent before its connections count as dead
/// (FERROCCL_SOCKET_DEAD_PEER seconds; `None`: the system's TCP defaults, minutes to hours).
pub fn dead_peer_limit() -> Option<Duration> {
    static LIMIT: std::sync::OnceLock<Option<Duration>> = std::sync::OnceLock::new();
    *LIMIT.get_or_init(|| {
        crate::env::get_seconds_opt("FERROCCL_SOCKET_DEAD_PEER").filter(|d| !d.is_zero() && d.as_millis() >= 1000)
    })
}

/// Makes a connection fail, within [`dead_peer_limit`], once the peer's host stops answering
/// at the TCP level (powered off, unplugged, partitioned: nothing closes the socket). An idle
/// connection sends keepalive probes from a third of the limit on, one a second
/// (SO_KEEPALIVE, TCP_KEEPIDLE, TCP_KEEPINTVL, TCP_KEEPCNT); TCP_USER_TIMEOUT ends it once
/// sent data or probes go unacknowledged for the limit. A stopped or busy peer process is
/// not affected (its kernel still answers); a dead one closes its sockets anyway.
pub fn watch_liveness(tcp: &TcpStream) -> Result<()> {
    let Some(limit) = dead_peer_limit() else { return Ok(()) };
    let idle = (limit / 3).max(Duration::from_secs(1));
    let probes = ((limit.as_secs().saturating_sub(idle.as_secs())).max(1)) as u32;
    use rustix::net::sockopt;
    let sys = |what: &str, e: rustix::io::Errno| Error::system(what, e.into());
    sockopt::set_socket_keepalive(tcp, true).map_err(|e| sys("SO_KEEPALIVE", e))?;
    sockopt::set_tcp_keepidle(tcp, idle).map_err(|e| sys("TCP_KEEPIDLE", e))?;
    sockopt::set_tcp_keepintvl(tcp, Duration::from_secs(1)).map_err(|e| sys("TCP_KEEPINTVL", e))?;
    sockopt::set_tcp_keepcnt(tcp, probes).map_err(|e| sys("TCP_KEEPCNT", e))?;
    let ms = u32::try_from(limit.as_millis()).unwrap_or(u32::MAX);
    sockopt::set_tcp_user_timeout(tcp, ms).map_err(|e| sys("TCP_USER_TIMEOUT", e))
}

/// Which side of a connection (the connecting side is the TLS client).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Client,
    Server,
}

/// Longest a listener waits for one peer's TLS handshake before dropping it.
const HANDSHAKE_LIMIT: Duration = Duration::from_secs(10);

enum Inner {
    Plain(TcpStream),
    #[cfg(feature = "openssl3")]
    Tls(Box<crate::tls::TlsStream>),
}

/// A connected byte stream: plaintext TCP, or TLS 1.3 whenever a key is configured (then
/// plaintext streams cannot be made at all).
pub struct Stream {
    inner: Inner,
    peer: SocketAddr,
    registration: Option<tls::Registration>,
}

impl Stream {
    /// A plaintext stream; refused (fail closed) while a key is configured or under the
    /// strict policy.
    pub fn from_tcp(tcp: TcpStream) -> Result<Stream> {
        crate::encryption::require_plaintext_allowed("TCP connection")?;
        let peer = tcp.peer_addr().map_err(|e| Error::system("getpeername", e))?;
        tcp.set_nodelay(true).map_err(|e| Error::system("TCP_NODELAY", e))?;
        watch_liveness(&tcp)?;
        Ok(Stream { inner: Inner::Plain(tcp), peer, registration: None })
    }

    /// The stream for a new blocking connection: a TLS handshake (bounded by `deadline`) when
    /// a key is configured, else plaintext.
    pub fn establish(tcp: TcpStream, role: Role, deadline: Instant) -> Result<Stream> {
        if !crate::encryption::enabled() {
            return Stream::from_tcp(tcp);
        }
        let mut hs = Handshake::start(tcp, role)?;
        let peer = hs.peer();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout(format!("TLS handshake with {peer}: no answer before the deadline")));
            }
            hs.set_blocking_timeout(left)?;
            if hs.step()? {
                return hs.finish();
            }
        }
    }

    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// The TCP socket underneath (for options and polling; bytes go through the Stream).
    pub fn tcp(&self) -> &TcpStream {
        match &self.inner {
            Inner::Plain(t) => t,
            #[cfg(feature = "openssl3")]
            Inner::Tls(t) => t.tcp(),
        }
    }

    pub fn fd(&self) -> RawFd {
        self.tcp().as_raw_fd()
    }

    /// How this connection is protected.
    pub fn security(&self) -> tls::Security {
        match &self.inner {
            Inner::Plain(_) => tls::Security::Plain,
            #[cfg(feature = "openssl3")]
            Inner::Tls(t) => t.security(),
        }
    }

    pub fn is_tls(&self) -> bool {
        self.security().is_encrypted()
    }

    /// Records the connection in the coverage registry under communicator `magic` (once;
    /// later calls are ignored).
    pub fn attribute(&mut self, magic: u64, owner: tls::Owner, channel: tls::Channel) {
        if self.registration.is_none() {
            self.registration = Some(tls::register(magic, owner, channel, self.security()));
        }
    }

    /// Input already received and decrypted in user space, which poll() on the socket would
    /// not report.
    pub fn pending(&self) -> bool {
        match &self.inner {
            Inner::Plain(_) => false,
            #[cfg(feature = "openssl3")]
            Inner::Tls(t) => t.pending(),
        }
    }

    /// Sending side of a data connection: coalesce TLS records into large writes, and rotate
    /// keys every FERROCCL_TLS_REKEY_BYTES. Writers must then call [`Stream::flush_pending`].
    pub fn configure_for_data(&mut self) {
        #[cfg(feature = "openssl3")]
        if let Inner::Tls(t) = &mut self.inner {
            t.batch_writes();
            t.set_rekey_after(tls::rekey_bytes());
        }
    }

    /// Receiving side of a data connection (after its hello): TLS records are read many per
    /// recv().
    pub fn configure_for_receiving(&mut self) {
        #[cfg(feature = "openssl3")]
        if let Inner::Tls(t) = &mut self.inner {
            t.batch_reads();
        }
    }

    /// Ciphertext waits in user space for the socket.
    pub fn unflushed(&self) -> bool {
        match &self.inner {
            Inner::Plain(_) => false,
            #[cfg(feature = "openssl3")]
            Inner::Tls(t) => t.unflushed(),
        }
    }

    /// Pushes buffered ciphertext to the socket; WouldBlock while it is full.
    pub fn flush_pending(&mut self) -> io::Result<()> {
        match &mut self.inner {
            Inner::Plain(_) => Ok(()),
            #[cfg(feature = "openssl3")]
            Inner::Tls(t) => t.flush_pending(),
        }
    }

    pub fn set_timeout(&self, timeout: Option<Duration>) -> Result<()> {
        self.tcp().set_read_timeout(timeout).map_err(|e| Error::system("SO_RCVTIMEO", e))?;
        self.tcp().set_write_timeout(timeout).map_err(|e| Error::system("SO_SNDTIMEO", e))
    }

    pub fn set_nonblocking(&self, on: bool) -> Result<()> {
        self.tcp().set_nonblocking(on).map_err(|e| Error::system("O_NONBLOCK", e))
    }

    pub fn shutdown(&self) {
        let _ = self.tcp().shutdown(Shutdown::Both);
    }

    /// Writes all of `data`, mapping failures to errors naming `what`.
    pub fn write_all_or(&mut self, data: &[u8], what: &str) -> Result<()> {
        self.write_all(data).map_err(|e| io_error(e, what, self.peer))?;
        self.flush().map_err(|e| io_error(e, what, self.peer))
    }

    /// Reads exactly `buf.len()` bytes.
    pub fn read_exact_or(&mut self, buf: &mut [u8], what: &str) -> Result<()> {
        self.read_exact(buf).map_err(|e| io_error(e, what, self.peer))
    }

    /// A length-prefixed message (u32 little-endian length, then the bytes).
    pub fn send_msg(&mut self, data: &[u8], what: &str) -> Result<()> {
        let len = u32::try_from(data.len())
            .map_err(|_| Error::internal(format!("{what}: message of {} bytes too long", data.len())))?;
        let mut frame = Vec::with_capacity(4 + data.len());
        frame.extend_from_slice(&len.to_le_bytes());
        frame.extend_from_slice(data);
        self.write_all_or(&frame, what)
    }

    /// Sleeps until input is waiting (or buffered after decryption), in slices between which
    /// it checks `interrupt` and `deadline`: a blocking read after this does not hang a call
    /// that its communicator's abort should end.
    pub fn await_input(&self, interrupt: Option<&Interrupt>, deadline: Instant, what: &str) -> Result<()> {
        loop {
            if self.pending() {
                return Ok(());
            }
            let slice = crate::interrupt::check_wait(interrupt, deadline, what)?;
            if wait_readable(self.tcp(), slice) {
                return Ok(());
            }
        }
    }

    /// Receives one length-prefixed message of at most `max` bytes (more is garbage).
    pub fn recv_msg(&mut self, max: usize, what: &str) -> Result<Vec<u8>> {
        let mut len = [0u8; 4];
        self.read_exact_or(&mut len, what)?;
        let len = u32::from_le_bytes(len) as usize;
        if len > max {
            return Err(Error::remote(format!(
                "{what}: peer {} announced a {len}-byte message (limit {max}); dropping connection",
                self.peer
            )));
        }
        let mut data = vec![0u8; len];
        self.read_exact_or(&mut data, what)?;
        Ok(data)
    }

    /// Sends the hello (inside TLS when encrypted) and registers the connection as the
    /// sender's (client side).
    pub fn send_hello(&mut self, hello: &Hello) -> Result<()> {
        self.attribute(hello.magic, tls::Owner::Rank(hello.rank), hello.kind.channel());
        self.write_all_or(&hello.encode(), "hello")
    }

    pub fn recv_hello(&mut self, magic: u64) -> Result<Hello> {
        let mut b = [0u8; HELLO_BYTES];
        self.read_exact_or(&mut b, "hello")?;
        Hello::decode(&b, magic)
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        #[cfg(feature = "openssl3")]
        if let Inner::Tls(t) = &mut self.inner {
            tls::note_rekeys(self.registration.as_ref().map(|r| r.magic()), t.take_rekeys());
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match &mut self.inner {
            Inner::Plain(t) => t.read(buf),
            #[cfg(feature = "openssl3")]
            Inner::Tls(t) => t.read(buf),
        }
    }

    /// Plaintext: one readv. TLS: fills the first non-empty buffer (records are decrypted one
    /// at a time anyway).
    fn read_vectored(&mut self, bufs: &mut [io::IoSliceMut<'_>]) -> io::Result<usize> {
        match &mut self.inner {
            Inner::Plain(t) => t.read_vectored(bufs),
            #[cfg(feature = "openssl3")]
            Inner::Tls(t) => match bufs.iter_mut().find(|b| !b.is_empty()) {
                Some(b) => t.read(b),
                None => Ok(0),
            },
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &mut self.inner {
            Inner::Plain(t) => t.write(buf),
            #[cfg(feature = "openssl3")]
            Inner::Tls(t) => {
                let r = t.write(buf);
                let n = t.take_rekeys();
                if n > 0 {
                    tls::note_rekeys(self.registration.as_ref().map(|r| r.magic()), n);
                }
                r
            }
        }
    }

    /// Plaintext: one writev. TLS: writes the first non-empty buffer (callers that care about
    /// record packing coalesce small pieces themselves).
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match &mut self.inner {
            Inner::Plain(t) => t.write_vectored(bufs),
            #[cfg(feature = "openssl3")]
            Inner::Tls(_) => match bufs.iter().find(|b| !b.is_empty()) {
                Some(b) => self.write(b),
                None => Ok(0),
            },
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match &mut self.inner {
            Inner::Plain(t) => t.flush(),
            #[cfg(feature = "openssl3")]
            Inner::Tls(t) => t.flush_pending(),
        }
    }
}

enum HsState {
    Plain(TcpStream),
    #[cfg(feature = "openssl3")]
    Tls(Box<crate::tls::MidHandshake>),
}

/// A connection on its way to becoming a [`Stream`]: the TLS handshake, step by step, on
/// blocking or non-blocking sockets. Plaintext connections are ready at once.
pub struct Handshake {
    state: HsState,
    peer: SocketAddr,
    started: Instant,
}

impl Handshake {
    /// Starts the handshake `role` requires under the process's setting.
    pub fn start(tcp: TcpStream, role: Role) -> Result<Handshake> {
        let peer = tcp.peer_addr().map_err(|e| Error::system("getpeername", e))?;
        tcp.set_nodelay(true).map_err(|e| Error::system("TCP_NODELAY", e))?;
        watch_liveness(&tcp)?;
        let started = Instant::now();
        if !crate::encryption::enabled() {
            crate::encryption::require_plaintext_allowed("TCP connection")?;
            return Ok(Handshake { state: HsState::Plain(tcp), peer, started });
        }
        #[cfg(feature = "openssl3")]
        {
            let role = match role {
                Role::Client => crate::tls::Role::Client,
                Role::Server => crate::tls::Role::Server,
            };
            let hs = crate::tls::MidHandshake::start(tcp, role, peer)?;
            Ok(Handshake { state: HsState::Tls(Box::new(hs)), peer, started })
        }
        #[cfg(not(feature = "openssl3"))]
        {
            let _ = role;
            crate::encryption::require_plaintext_allowed("TCP connection")?;
            unreachable!("a key cannot be configured without TLS support")
        }
    }

    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    pub fn started(&self) -> Instant {
        self.started
    }

    /// The TCP socket underneath (for polling; bytes go through the handshake).
    pub fn tcp(&self) -> &TcpStream {
        match &self.state {
            HsState::Plain(t) => t,
            #[cfg(feature = "openssl3")]
            HsState::Tls(h) => h.tcp(),
        }
    }

    /// Blocking sockets: bounds each read and write of the handshake.
    fn set_blocking_timeout(&self, t: Duration) -> Result<()> {
        let t = Some(t.max(Duration::from_millis(1)));
        self.tcp().set_read_timeout(t).map_err(|e| Error::system("SO_RCVTIMEO", e))?;
        self.tcp().set_write_timeout(t).map_err(|e| Error::system("SO_SNDTIMEO", e))
    }

    /// Advances; `Ok(true)` once complete (then call [`Handshake::finish`]).
    pub fn step(&mut self) -> Result<bool> {
        match &mut self.state {
            HsState::Plain(_) => Ok(true),
            #[cfg(feature = "openssl3")]
            HsState::Tls(h) => h.step(),
        }
    }

    /// What the handshake waits for.
    pub fn wait_hint(&self) -> super::WaitHint {
        let fd = self.tcp().as_raw_fd();
        match &self.state {
            HsState::Plain(_) => super::WaitHint { fd, readable: false, writable: true },
            #[cfg(feature = "openssl3")]
            HsState::Tls(h) => super::WaitHint { fd, readable: !h.wants_write(), writable: h.wants_write() },
        }
    }

    /// The verified stream (a TLS session that is not what we require is an error).
    pub fn finish(self) -> Result<Stream> {
        match self.state {
            HsState::Plain(tcp) => Ok(Stream { inner: Inner::Plain(tcp), peer: self.peer, registration: None }),
            #[cfg(feature = "openssl3")]
            HsState::Tls(h) => {
                let t = h.finish()?;
                Ok(Stream { inner: Inner::Tls(Box::new(t)), peer: self.peer, registration: None })
            }
        }
    }
}

/// An I/O failure as a ferroccl error: a vanished peer is `Remote`, a timeout `Timeout`.
pub fn io_error(e: io::Error, what: &str, peer: SocketAddr) -> Error {
    // ETIMEDOUT from the TCP stack itself (keepalive probes or sent data unacknowledged, see
    // `watch_liveness`): the peer's host is gone. A read timeout (SO_RCVTIMEO) is EAGAIN.
    if e.raw_os_error() == Some(libc::ETIMEDOUT) {
        let limit = dead_peer_limit().map_or(String::new(), |d| format!(" for {} s", d.as_secs_f64()));
        return Error::remote(format!(
            "{what}: the host of {peer} stopped answering (no TCP acknowledgement{limit}; FERROCCL_SOCKET_DEAD_PEER)"
        ));
    }
    match e.kind() {
        io::ErrorKind::UnexpectedEof
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::BrokenPipe => Error::remote(format!("{what}: connection to {peer} closed ({e})")),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Error::Timeout(format!("{what}: no answer from {peer}")),
        io::ErrorKind::InvalidData => Error::remote(format!("{what}: connection to {peer} failed ({e})")),
        _ => Error::system(format!("{what} with {peer}"), e),
    }
}

/// Listens on `ip` with an ephemeral port (or `port`).
pub fn listen(ip: IpAddr, port: u16) -> Result<TcpListener> {
    TcpListener::bind(SocketAddr::new(ip, port)).map_err(|e| Error::system(format!("bind {ip}:{port}"), e))
}

/// Connects, retrying refused connections like NCCL (NCCL_SOCKET_RETRY_CNT x
/// NCCL_SOCKET_RETRY_SLEEP_MSEC) and never past `deadline`; then runs the TLS client
/// handshake when encryption is on (blocking, bounded by `deadline`).
pub fn connect(addr: SocketAddr, deadline: Instant) -> Result<Stream> {
    let tcp = connect_tcp(addr, deadline)?;
    Stream::establish(tcp, Role::Client, deadline)
}

/// The TCP part of [`connect`]. Fails at once (before touching the network) when the
/// connection could only be plaintext and plaintext is not allowed.
pub fn connect_tcp(addr: SocketAddr, deadline: Instant) -> Result<TcpStream> {
    if !crate::encryption::enabled() {
        crate::encryption::require_plaintext_allowed("TCP connection")?;
    }
    let retries = crate::env::get_int("NCCL_SOCKET_RETRY_CNT").max(0) as u32;
    let sleep = Duration::from_millis(crate::env::get_int("NCCL_SOCKET_RETRY_SLEEP_MSEC").max(1) as u64);
    let mut attempt = 0u32;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::Timeout(format!("connect to {addr}: bootstrap timeout")));
        }
        match TcpStream::connect_timeout(&addr, left) {
            Ok(tcp) => {
                watch_liveness(&tcp)?;
                return Ok(tcp);
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionRefused | io::ErrorKind::Interrupted | io::ErrorKind::AddrNotAvailable
                ) && attempt < retries =>
            {
                attempt += 1;
                std::thread::sleep(sleep.min(left));
            }
            Err(e) => return Err(Error::system(format!("connect to {addr}"), e)),
        }
    }
}

/// Accepts one connection (with its TLS server handshake when encryption is on), giving up
/// at `deadline`. A peer that fails the handshake (plaintext, garbage, another key) is
/// logged and dropped, and accepting goes on. For tests only: handshakes here run one at a
/// time, so listeners that strangers can reach use [`HelloQueue`] instead.
#[cfg(test)]
pub fn accept(listener: &TcpListener, deadline: Instant) -> Result<Stream> {
    accept_or_interrupt(listener, deadline, None)
}

/// [`accept`], giving up as well once `interrupt` is set.
#[cfg(test)]
pub fn accept_or_interrupt(listener: &TcpListener, deadline: Instant, interrupt: Option<&Interrupt>) -> Result<Stream> {
    listener.set_nonblocking(true).map_err(|e| Error::system("O_NONBLOCK", e))?;
    loop {
        match listener.accept() {
            Ok((tcp, from)) => {
                tcp.set_nonblocking(false).map_err(|e| Error::system("O_NONBLOCK", e))?;
                if !crate::encryption::enabled() {
                    match Stream::from_tcp(tcp) {
                        // A connection reset before we looked (a port scan) has no peer address.
                        Err(e @ Error::System { .. }) => {
                            log::info!(target: "BOOTSTRAP", "dropped connection from {from}: {e}");
                            continue;
                        }
                        other => return other,
                    }
                }
                let limit = deadline.min(Instant::now() + HANDSHAKE_LIMIT);
                match Stream::establish(tcp, Role::Server, limit) {
                    Ok(s) => return Ok(s),
                    Err(e @ (Error::System { .. } | Error::Internal(_))) => return Err(e),
                    Err(e) => log::warn!(target: "BOOTSTRAP", "dropped connection from {from}: {e}"),
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted => {
                if Instant::now() >= deadline {
                    return Err(Error::Timeout("accept: no peer connected before the bootstrap timeout".into()));
                }
                if let Some(i) = interrupt {
                    i.check("accept")?;
                }
                wait_readable(listener, Duration::from_millis(50));
            }
            Err(e) => return Err(Error::system("accept", e)),
        }
    }
}

/// Longest a listener waits for a stranger's hello (after any TLS handshake) before dropping
/// it. Peers write their hello right after connecting, so only a silent or dribbling
/// connection (half-open, slowloris) ever reaches it.
pub const HELLO_LIMIT: Duration = Duration::from_secs(2);
/// Connections a [`HelloQueue`] keeps waiting for their hellos (and, apart, handshakes in
/// progress); beyond it the oldest is dropped.
const MAX_WAITING_HELLOS: usize = 128;
/// Connections a [`HelloQueue`] takes from its listener before stepping the handshakes again.
const ACCEPTS_PER_ROUND: usize = 32;

/// Connections accepted on a setup listener whose TLS handshakes or hellos have not finished.
/// They are served side by side (non-blocking), so garbage, silent connections, port scans and
/// slow dribblers cost the legitimate peers nothing but a poll: each is dropped when its bytes
/// are not TLS or not a hello, when it closes, after [`HANDSHAKE_LIMIT`] in its handshake or
/// after [`HELLO_LIMIT`] waiting for its hello.
#[derive(Default)]
pub struct HelloQueue {
    /// Server handshakes in progress (encryption on), with when each started.
    handshaking: Vec<(Handshake, Instant)>,
    waiting: Vec<(Stream, [u8; HELLO_BYTES], usize, Instant)>,
}

impl HelloQueue {
    /// The next connection on `listener` whose hello carries `magic`, as a blocking stream,
    /// with its hello; fails at `deadline` or once `interrupt` is set.
    pub fn next(
        &mut self,
        listener: &TcpListener,
        magic: u64,
        deadline: Instant,
        interrupt: Option<&Interrupt>,
    ) -> Result<(Stream, Hello)> {
        listener.set_nonblocking(true).map_err(|e| Error::system("O_NONBLOCK", e))?;
        let entered = Instant::now();
        loop {
            self.accept_waiting(listener);
            self.advance_handshakes(deadline, entered);
            let now = Instant::now();
            let mut i = 0;
            while i < self.waiting.len() {
                let (s, buf, got, since) = &mut self.waiting[i];
                let mut outcome: Option<std::result::Result<(), String>> = None;
                while *got < HELLO_BYTES {
                    match s.read(&mut buf[*got..]) {
                        Ok(0) => {
                            outcome = Some(Err("closed before its hello".into()));
                            break;
                        }
                        Ok(n) => *got += n,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => {
                            outcome = Some(Err(e.to_string()));
                            break;
                        }
                    }
                }
                if outcome.is_none() && *got == HELLO_BYTES {
                    outcome = Some(Ok(()));
                } else if outcome.is_none() && now.duration_since(*since) > HELLO_LIMIT {
                    outcome = Some(Err(format!("no hello within {:?} ({} of {HELLO_BYTES} bytes)", HELLO_LIMIT, *got)));
                }
                match outcome {
                    None => i += 1,
                    Some(Err(why)) => {
                        let (s, ..) = self.waiting.swap_remove(i);
                        log::info!(target: "BOOTSTRAP", "Bootstrap: dropped connection from {}: {why}", s.peer());
                    }
                    Some(Ok(())) => {
                        let (s, buf, ..) = self.waiting.swap_remove(i);
                        match Hello::decode(&buf, magic) {
                            Ok(h) => {
                                s.set_nonblocking(false)?;
                                return Ok((s, h));
                            }
                            Err(e) => {
                                log::info!(target: "BOOTSTRAP", "Bootstrap: dropped connection from {}: {e}", s.peer())
                            }
                        }
                    }
                }
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout("accept: no peer connected before the bootstrap timeout".into()));
            }
            if let Some(i) = interrupt {
                i.check("accept")?;
            }
            let mut fds = vec![rustix::event::PollFd::new(listener, rustix::event::PollFlags::IN)];
            for (s, ..) in &self.waiting {
                if s.pending() {
                    fds.clear();
                    break;
                }
                fds.push(rustix::event::PollFd::new(s.tcp(), rustix::event::PollFlags::IN));
            }
            if !fds.is_empty() {
                for (h, _) in &self.handshaking {
                    let hint = h.wait_hint();
                    let mut flags = rustix::event::PollFlags::empty();
                    flags.set(rustix::event::PollFlags::IN, hint.readable);
                    flags.set(rustix::event::PollFlags::OUT, hint.writable);
                    fds.push(rustix::event::PollFd::new(h.tcp(), flags));
                }
                super::poll_ms(&mut fds, 50);
            }
        }
    }

    /// Takes the connections waiting on `listener` (at most [`ACCEPTS_PER_ROUND`], so that a
    /// burst of strangers cannot push a peer's handshake out before it is ever stepped): into
    /// a TLS handshake when encryption is on, else straight to waiting for its hello.
    fn accept_waiting(&mut self, listener: &TcpListener) {
        for _ in 0..ACCEPTS_PER_ROUND {
            let (tcp, from) = match listener.accept() {
                Ok(x) => x,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // WouldBlock, or EMFILE and the like: take the rest later.
                Err(_) => return,
            };
            if crate::encryption::enabled() {
                // Non-blocking from the start: a peer that stalls its handshake must not hold
                // up the others.
                let started = tcp
                    .set_nonblocking(true)
                    .map_err(|e| Error::system("O_NONBLOCK", e))
                    .and_then(|()| Handshake::start(tcp, Role::Server));
                match started {
                    Ok(h) => {
                        if self.handshaking.len() >= MAX_WAITING_HELLOS {
                            let (old, _) = self.handshaking.remove(0);
                            log::warn!(target: "BOOTSTRAP", "Bootstrap: too many TLS handshakes at once; dropped {}", old.peer());
                        }
                        self.handshaking.push((h, Instant::now()));
                    }
                    Err(e) => log::info!(target: "BOOTSTRAP", "Bootstrap: dropped connection from {from}: {e}"),
                }
                continue;
            }
            match Stream::from_tcp(tcp).and_then(|s| s.set_nonblocking(true).map(|()| s)) {
                Ok(s) => self.wait_for_hello(s),
                Err(e) => log::info!(target: "BOOTSTRAP", "Bootstrap: dropped connection from {from}: {e}"),
            }
        }
    }

    /// Steps every TLS handshake in progress; a finished one goes on to wait for its hello, a
    /// failed one is dropped, and so is one unfinished after [`HANDSHAKE_LIMIT`] of serving
    /// (counted from the later of its start and `entered`, when the current [`HelloQueue::next`]
    /// began: handshakes only move while someone is in it, so time spent away is not the
    /// peer's) or at `deadline`.
    fn advance_handshakes(&mut self, deadline: Instant, entered: Instant) {
        let mut i = 0;
        while i < self.handshaking.len() {
            let (h, since) = &mut self.handshaking[i];
            let stepped = h.step();
            let peer = h.peer();
            let served = (*since).max(entered).elapsed();
            let expired = served > HANDSHAKE_LIMIT || Instant::now() >= deadline;
            match stepped {
                Ok(false) if !expired => i += 1,
                Ok(false) => {
                    self.handshaking.swap_remove(i);
                    log::warn!(target: "BOOTSTRAP", "Bootstrap: dropped connection from {peer}: TLS handshake unfinished after {:.1} s", served.as_secs_f64());
                }
                Ok(true) => {
                    let (h, _) = self.handshaking.swap_remove(i);
                    match h.finish().and_then(|s| s.set_nonblocking(true).map(|()| s)) {
                        Ok(s) => self.wait_for_hello(s),
                        Err(e) => log::warn!(target: "BOOTSTRAP", "Bootstrap: dropped connection from {peer}: {e}"),
                    }
                }
                Err(e) => {
                    self.handshaking.swap_remove(i);
                    log::warn!(target: "BOOTSTRAP", "Bootstrap: dropped connection from {peer}: {e}");
                }
            }
        }
    }

    fn wait_for_hello(&mut self, stream: Stream) {
        if self.waiting.len() >= MAX_WAITING_HELLOS {
            let (old, ..) = self.waiting.remove(0);
            log::warn!(target: "BOOTSTRAP", "Bootstrap: too many connections without a hello; dropped {}", old.peer());
        }
        self.waiting.push((stream, [0; HELLO_BYTES], 0, Instant::now()));
    }
}

/// Blocks until `fd` is readable (or hung up) or `timeout` passes; true when it is.
pub fn wait_readable(fd: &impl std::os::fd::AsFd, timeout: Duration) -> bool {
    let mut pfd = [rustix::event::PollFd::new(fd, rustix::event::PollFlags::IN)];
    super::poll_ms(&mut pfd, timeout.as_millis().min(i32::MAX as u128) as i64) > 0
}

/// Parses NCCL_COMM_ID: `<ipv4>:<port>`, `[<ipv6>]:<port>` or `<host>:<port>`.
pub fn parse_comm_id(spec: &str) -> Result<SocketAddr> {
    use std::net::ToSocketAddrs;
    let bad = || Error::invalid_argument(format!("NCCL_COMM_ID '{spec}': expected <host>:<port> or [<ipv6>]:<port>"));
    if let Ok(addr) = spec.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let (host, port) = spec.rsplit_once(':').ok_or_else(bad)?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    (host.trim_start_matches('[').trim_end_matches(']'), port)
        .to_socket_addrs()
        .map_err(|_| bad())?
        .next()
        .ok_or_else(bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comm_id_forms() {
        assert_eq!(parse_comm_id("127.0.0.1:1234").unwrap(), "127.0.0.1:1234".parse().unwrap());
        assert_eq!(parse_comm_id("[::1]:99").unwrap(), "[::1]:99".parse().unwrap());
        assert_eq!(parse_comm_id("localhost:80").unwrap().port(), 80);
        assert!(parse_comm_id("nonsense").is_err());
        assert!(parse_comm_id("host:notaport").is_err());
    }

    #[test]
    fn framed_messages_and_garbage_limit() {
        let l = listen("127.0.0.1".parse().unwrap(), 0).unwrap();
        let addr = l.local_addr().unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let t = std::thread::spawn(move || {
            let mut s = accept(&l, deadline).unwrap();
            let a = s.recv_msg(100, "test").unwrap();
            let b = s.recv_msg(4, "test");
            (a, b.is_err())
        });
        let mut c = connect(addr, deadline).unwrap();
        c.send_msg(b"hello", "test").unwrap();
        c.send_msg(b"too long for the limit", "test").unwrap();
        let (a, rejected) = t.join().unwrap();
        assert_eq!(a, b"hello");
        assert!(rejected);
    }
}
