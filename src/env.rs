//! Every environment parameter ferroccl understands, and the one place that reads them.
//!
//! Owns: the registry [`PARAMS`] (name, type, default, help), parsing of values, NCCL's config
//! files, the process-wide cache, and the README's environment table. Nothing else in the
//! crate calls `std::env`; other modules ask [`get_str`], [`get_int`], [`get_bool`] and
//! [`get_bytes`] (or the same methods on a [`Snapshot`] in tests).
//!
//! Sources, highest precedence first (as NCCL): the process environment, then the user file
//! (`$NCCL_CONF_FILE` if set, else `~/.nccl.conf`), then `/etc/nccl.conf`. Files hold
//! `NAME=value` lines; blank lines and lines starting with `#` are skipped. An empty value
//! counts as unset. Values are read once, on first use, and never change afterwards.
//!
//! Invariants: every name handed to a getter is in [`PARAMS`] (debug builds assert it, which
//! catches typos); every default parses as its [`ParamKind`] (unit-tested). An invalid value
//! falls back to the default and leaves a message in [`warnings`] (NCCL's wording).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::OnceLock;

/// How a parameter's value is parsed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamKind {
    /// A signed integer, decimal or `0x` hex.
    Int,
    /// An integer; nonzero means true.
    Bool,
    /// Free text, interpreted by the module that uses it.
    String,
    /// A byte count: a plain integer, optionally with a `K`, `M`, `G` or `T` suffix
    /// (powers of 1024; `KB`/`KiB` spellings and lower case are accepted too).
    Bytes,
    /// A duration in seconds: a non-negative integer or decimal fraction (`5`, `0.5`).
    Seconds,
}

impl ParamKind {
    /// Lower-case name used in the README table.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Int => "int",
            Self::Bool => "bool",
            Self::String => "string",
            Self::Bytes => "bytes",
            Self::Seconds => "seconds",
        }
    }
}

/// One environment parameter.
#[derive(Debug)]
pub struct Param {
    /// Variable name, e.g. `NCCL_SOCKET_IFNAME`.
    pub name: &'static str,
    /// How the value is parsed.
    pub kind: ParamKind,
    /// Default as text; empty means "unset" (the consumer decides, often "auto").
    pub default: &'static str,
    /// One line for the README and `--help`-style listings.
    pub help: &'static str,
}

const fn param(name: &'static str, kind: ParamKind, default: &'static str, help: &'static str) -> Param {
    Param { name, kind, default, help }
}

use ParamKind::{Bool, Bytes, Int, Seconds, String as Str};

/// The registry: every parameter ferroccl reads, in README order.
pub static PARAMS: &[Param] = &[
    // Logging.
    param("NCCL_DEBUG", Str, "", "Log level: VERSION, WARN, INFO or TRACE (ABORT acts as WARN); unset logs nothing"),
    param(
        "NCCL_DEBUG_SUBSYS",
        Str,
        "INIT,BOOTSTRAP,ENV",
        "Subsystems logged at INFO/TRACE: comma list of INIT COLL P2P SHM NET GRAPH TUNING ENV \
         ALLOC CALL PROXY NVLS BOOTSTRAP REG PROFILE RAS DESTROY ALL; a leading ^ excludes them",
    ),
    param(
        "NCCL_DEBUG_FILE",
        Str,
        "",
        "Write the log to this file instead of stdout; %h expands to the host name, %p to the pid",
    ),
    param(
        "NCCL_CONF_FILE",
        Str,
        "",
        "User config file read instead of ~/.nccl.conf (NAME=value lines; /etc/nccl.conf is \
         read after it, the environment wins over both)",
    ),
    // Bootstrap and sockets.
    param(
        "NCCL_COMM_ID",
        Str,
        "",
        "Fixed bootstrap root address <ipv4>:<port>, [<ipv6>]:<port> or <host>:<port>; rank 0 \
         runs the root",
    ),
    param(
        "NCCL_SOCKET_IFNAME",
        Str,
        "",
        "Interfaces for sockets: comma list of name prefixes, ^ excludes, = exact names; unset \
         avoids lo and docker*",
    ),
    param("NCCL_SOCKET_FAMILY", Str, "", "Address family for sockets: AF_INET or AF_INET6; unset takes either"),
    param("NCCL_HOSTID", Str, "", "Host identity used to find ranks on the same host, instead of hostname + boot id"),
    param("NCCL_SOCKET_NTHREADS", Int, "", "Helper threads per socket connection (0 = none, data moves on the progress thread; 1-16); unset: 2-4 striped sockets (one per 4 cores) on hosts with 8+ cores, else 0"),
    param(
        "NCCL_NSOCKS_PERTHREAD",
        Int,
        "",
        "Data sockets per helper thread (threads x sockets <= 64); unset picks automatically",
    ),
    param("NCCL_SOCKET_RETRY_CNT", Int, "34", "How many times a refused or timed-out socket connect is retried"),
    param("NCCL_SOCKET_RETRY_SLEEP_MSEC", Int, "100", "Sleep between socket connect retries, in milliseconds"),
    // Transports.
    param("NCCL_SHM_DISABLE", Bool, "0", "1 disables the shared-memory transport between processes on one host"),
    param("NCCL_P2P_DISABLE", Bool, "0", "1 disables direct GPU transfers: device collectives of ranks sharing a GPU then go through pinned host staging"),
    param(
        "NCCL_NET",
        Str,
        "",
        "Network of the NET transport: IB or Socket (any case); unset takes IB when a usable HCA \
         port is present (builds with the ib feature), else Socket; IB when unavailable fails \
         init with ncclInvalidUsage",
    ),
    param("NCCL_IB_DISABLE", Bool, "0", "1 disables InfiniBand/RoCE; the network transport uses sockets"),
    param(
        "NCCL_IB_HCA",
        Str,
        "",
        "HCA ports IB may use: comma list of name[:port] (NCCL's :rail:plane accepted, ignored); \
         a leading ^ excludes them, = matches names exactly instead of as prefixes",
    ),
    param(
        "NCCL_IB_GID_INDEX",
        Int,
        "-1",
        "GID table index for RoCE (0-255); -1 picks the first RoCE v2 IPv4-mapped GID, else the first RoCE v2 one, else 0",
    ),
    param("NCCL_IB_TIMEOUT", Int, "20", "IB local ACK timeout exponent (1-31): 4.096 us x 2^value before a retry"),
    param("NCCL_IB_RETRY_CNT", Int, "7", "IB transport retries (0-7) before a send fails with ncclRemoteError"),
    param("NCCL_BUFFSIZE", Bytes, "4194304", "Size of each per-peer staging buffer"),
    // Algorithms and communicators.
    param(
        "NCCL_ALGO",
        Str,
        "",
        "Allowed algorithms: comma list (ring, tree, ...), ^ excludes; per function as \
         ring;allreduce:tree",
    ),
    param("NCCL_PROTO", Str, "", "Allowed protocols: comma list of LL, LL128, Simple; ^ excludes"),
    param(
        "NCCL_COMM_BLOCKING",
        Bool,
        "",
        "0 makes every communicator non-blocking (init, split, shrink and group end may return \
         ncclInProgress), 1 blocking; either overrides ncclConfig_t.blocking, as in NCCL; unset \
         follows ncclConfig_t.blocking (default blocking)",
    ),
    // ferroccl's own.
    param(
        "FERROCCL_BOOTSTRAP_TIMEOUT",
        Int,
        "120",
        "Seconds bootstrap and connection setup wait for peers before failing",
    ),
    param(
        "FERROCCL_TIMEOUT",
        Seconds,
        "",
        "Seconds a collective or point-to-point call may make no progress (no byte moved, no peer \
         counter advanced) before it fails with ncclTimeout naming the ranks it waited for; \
         unset or 0 waits for ever, as NCCL",
    ),
    param(
        "FERROCCL_SOCKET_DEAD_PEER",
        Seconds,
        "6",
        "Seconds a peer host may leave TCP unanswered (vanished, partitioned) before its \
         connections fail with ncclRemoteError: keepalive probes on idle connections from a third \
         of it on, TCP_USER_TIMEOUT on unacknowledged data; 0 keeps the system's TCP defaults",
    ),
    param("FERROCCL_CHUNK_SIZE", Bytes, "524288", "Bytes per pipelined ring chunk"),
    param(
        "FERROCCL_STAGE_PIECE",
        Bytes,
        "262144",
        "Device-buffer operations staged through host memory (ranks on other GPUs or hosts) are \
         copied in and out in pieces of at least this many bytes (at most 16): the host engine \
         starts on the first piece to land and each finished piece goes back at once, so the copies \
         overlap the transfers; operations smaller than two pieces are copied whole",
    ),
    param(
        "FERROCCL_STAGE_SEPARATE_MIN",
        Bytes,
        "33554432",
        "From this size on, a staged all-reduce, broadcast or reduce on device buffers runs as up \
         to 16 separate operations on pieces of its buffers (each at least 8 MiB) instead of one \
         operation staged piece by piece; the same on every rank",
    ),
    param(
        "FERROCCL_TREE_THRESHOLD",
        Bytes,
        "65536",
        "All-reduce, broadcast and reduce of at most this many bytes use the latency (tree) \
         algorithm",
    ),
    param(
        "FERROCCL_NODE_ONESHOT_MAX",
        Bytes,
        "",
        "All-reduces (all-gathers: bytes per rank) on one host of at most this many bytes (up to 16K) \
         use the one-shot algorithm, larger ones the direct one; unset: chosen by the number of ranks",
    ),
    param(
        "FERROCCL_NODE_STAGE_MAX",
        Bytes,
        "",
        "On one host, a rank's buffers that its peers cannot map (malloc, stack, Fortran arrays) of \
         at most this many bytes travel through the shared area's slots, larger ones by kernel \
         copies (process_vm_readv); unset: chosen per collective and number of ranks (and, for \
         broadcasts at 3-8 ranks up to 4 MiB, every collective of ranks sharing cores up to 2 \
         MiB, and 2-rank all-reduces and reduce-scatters where kernel copies of 4 KiB pages \
         measure slow, by whether the buffer is on huge pages)",
    ),
    param(
        "FERROCCL_NODE_STAGE_TRIAL",
        Bool,
        "1",
        "1: a repeated host all-reduce, all-gather or reduce-scatter of two ranks with a core each, \
         whose buffers the rules pass \
         through the slots (FERROCCL_NODE_STAGE_MAX unset, 32 KiB and up) times both ways, slots and \
         peers' kernel copies, on its first 16 calls (then 16 of every 1024), every rank on the same \
         calls, and keeps the faster: fresh inputs favour the slots, inputs reused from the call \
         before (benchmarks) kernel copies; 0: the rules alone",
    ),
    param(
        "FERROCCL_NODE_RELAY_MIN",
        Bytes,
        "",
        "On one host, all-gathers of at least this many bytes (the whole output) at three or more \
         ranks go by relay, as a ring: each rank copies the blocks from its left neighbour's \
         output one step after the neighbour received them, instead of every rank copying every \
         block from its owner's input at once; unset: 3-16 ranks with a core each, 2-8 MiB in \
         buffers peers reach by kernel copies, 256 KiB-4 MiB (512 KiB-4 MiB from 9 ranks) in \
         buffers they read in place (ncclMemAlloc, ranks in one process); at 3 ranks from 1.5 \
         MiB (kernel copies) and 192 KiB (read in place), as three blocks fall short of a power \
         of two. An all-gather relays \
         only if every rank's setting includes its size and no rank passes its input through \
         its slot (FERROCCL_NODE_STAGE_MAX)",
    ),
    param(
        "FERROCCL_HUGE_PAGES",
        Bool,
        "1",
        "1: once an ordinary buffer (private anonymous memory) of a process rank has been reached \
         by its peers' kernel copies (process_vm_readv/writev) often enough (from 1 MiB: the second \
         time; from 16 KiB: once its uses moved 8 MiB), the rank asks the kernel to back the 2 MiB \
         regions under it with transparent huge pages (MADV_COLLAPSE, at most 64 MiB per \
         collective; a region reaching past the buffer only when at least half resident): fewer \
         pages for every copy to pin; 0: never",
    ),
    param(
        "FERROCCL_MEMCOPY",
        Str,
        "auto",
        "Copies of 2 KiB and more whose destination lies 1-63 bytes past its source modulo 4 KiB \
         (an array section such as a(2:n) against the library's slots), where glibc's memcpy runs \
         15x slower on AMD cores: auto measures memcpy against a vector loop once per distance \
         and size class and takes the faster; loop or memcpy forces one",
    ),
    param(
        "FERROCCL_SHARE_HEAP",
        Bool,
        "0",
        "1 lets a process rank turn a large malloc'd host buffer (a glibc mmapped chunk) into shared \
         memory in place the first time a one-host collective uses it, so peers read and write it \
         like ncclMemAlloc memory instead of copying it; side effects: fork() children share those \
         pages, they count as Shmem (see README)",
    ),
    param(
        "FERROCCL_SHARE_HEAP_MIN",
        Bytes,
        "1M",
        "With FERROCCL_SHARE_HEAP=1, buffers of at least this many bytes are shared; smaller ones \
         keep the slot or copy path",
    ),
    param(
        "FERROCCL_NODE_SLOT_SIZE",
        Bytes,
        "1M",
        "Bytes of each of a rank's two slots in the shared area of a one-host communicator (rank 0's \
         value counts; 16K to 64M): the piece size in which unmappable buffers travel",
    ),
    param(
        "FERROCCL_ENCRYPTION_POLICY",
        Str,
        "default",
        "default follows ncclSetEncryption; strict sends all traffic over encrypted sockets (no shared \
         memory, no IB: RDMA data cannot be encrypted)",
    ),
    param("FERROCCL_TLS_REKEY_BYTES", Bytes, "1G", "Bytes sent on one TLS connection before a TLS 1.3 KeyUpdate (0 disables rotation)"),
    param("FERROCCL_TOPO_DUMP", Str, "", "Write the detected topology to this path"),
    param(
        "FERROCCL_NODE_COLL",
        Bool,
        "1",
        "1 lets communicators whose ranks are all on this host all-reduce, all-gather, reduce-scatter and broadcast through one shared area (one-shot for small messages, direct above); 0 uses rings and trees over the transports",
    ),
    param(
        "FERROCCL_CUDA_DISABLE",
        Bool,
        "0",
        "1 keeps the library in host-memory mode even where a CUDA driver and GPU are present",
    ),
    param(
        "FERROCCL_PEER_PATH_ON_ONE_GPU",
        Bool,
        "0",
        "1 runs device-buffer collectives of ranks that share one GPU (one process each) on the path for ranks on \
         different GPUs with peer access, and device sends and receives between rank threads of one process that \
         share a GPU by address (taking turns; they must group their sends and receives with each other alike), to \
         test those paths on a one-GPU machine; set it alike on every rank",
    ),
    param(
        "FERROCCL_SHM_DIRECT",
        Bool,
        "1",
        "1 lets shared memory move messages of 64 KiB and more in one copy (process_vm_readv); 0 copies through the slots",
    ),
];

/// Looks up a parameter by name.
pub fn param_info(name: &str) -> Option<&'static Param> {
    PARAMS.iter().find(|p| p.name == name)
}

/// Where a value came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// The process environment (or the lookup handed to [`Snapshot::from_lookup`]).
    Environment,
    /// A config file; the text names it (a path, or `config file #N` in tests).
    ConfFile(String),
}

#[derive(Clone, Debug)]
struct Setting {
    value: String,
    source: Source,
}

/// The values of all parameters at one moment, plus the warnings parsing them produced.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    settings: HashMap<&'static str, Setting>,
    warnings: Vec<String>,
}

impl Snapshot {
    /// Builds a snapshot from `lookup` (stands for the environment) and config-file
    /// contents, highest precedence first (user file, then `/etc/nccl.conf`).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>, conf_files: &[&str]) -> Self {
        let labels: Vec<String> = (1..=conf_files.len()).map(|i| format!("config file #{i}")).collect();
        let files: Vec<(&str, &str)> = labels.iter().map(String::as_str).zip(conf_files.iter().copied()).collect();
        Self::build(lookup, &files, Vec::new())
    }

    /// Reads the process environment and NCCL's config files. Prefer the cached [`snapshot`].
    pub fn from_process() -> Self {
        let lookup = |name: &str| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned());
        let mut warnings = Vec::new();
        let mut files = Vec::new();
        for (path, explicit) in conf_file_paths(&lookup) {
            match std::fs::read_to_string(&path) {
                Ok(text) => files.push((path, text)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => {}
                Err(e) => warnings.push(format!("Could not read config file {path}: {e}")),
            }
        }
        let files: Vec<(&str, &str)> = files.iter().map(|(p, t)| (p.as_str(), t.as_str())).collect();
        Self::build(lookup, &files, warnings)
    }

    fn build(lookup: impl Fn(&str) -> Option<String>, files: &[(&str, &str)], mut warnings: Vec<String>) -> Self {
        let mut settings = HashMap::new();
        // Lowest precedence first, so later inserts win.
        for (label, text) in files.iter().rev() {
            for (name, value) in parse_conf(text) {
                // The user file is chosen by the environment only, as in NCCL.
                if name == "NCCL_CONF_FILE" {
                    continue;
                }
                if let Some(p) = param_info(name) {
                    let source = Source::ConfFile((*label).to_owned());
                    settings.insert(p.name, Setting { value, source });
                }
            }
        }
        for p in PARAMS {
            if let Some(value) = lookup(p.name).filter(|v| !v.is_empty()) {
                let source = Source::Environment;
                settings.insert(p.name, Setting { value, source });
            }
        }
        for p in PARAMS {
            if let Some(s) = settings.get(p.name) {
                if !is_valid(p.kind, &s.value) {
                    warnings.push(invalid_value_message(p, &s.value));
                }
            }
        }
        Self { settings, warnings }
    }

    /// The value as set (environment or file), or `None` when unset. Any kind.
    pub fn get_str(&self, name: &str) -> Option<String> {
        let p = checked(name, &[Int, Bool, Str, Bytes, Seconds]);
        self.raw(p).map(str::to_owned)
    }

    /// The value as set, else the default, else `None` (for defaults that mean "unset").
    pub fn get_str_or_default(&self, name: &str) -> Option<String> {
        let p = checked(name, &[Int, Bool, Str, Bytes]);
        self.raw(p).or(Some(p.default).filter(|d| !d.is_empty())).map(str::to_owned)
    }

    /// The integer value, else the default. For parameters whose default is unset
    /// ("auto"), use [`Snapshot::get_int_opt`]; debug builds assert that here.
    pub fn get_int(&self, name: &str) -> i64 {
        let p = checked(name, &[Int, Bool, Bytes]);
        debug_assert!(!p.default.is_empty(), "{name} has no default; use get_int_opt");
        self.int_opt(p).unwrap_or(0)
    }

    /// The integer value, else the default, else `None` when neither exists.
    pub fn get_int_opt(&self, name: &str) -> Option<i64> {
        self.int_opt(checked(name, &[Int, Bool, Bytes]))
    }

    /// True when the value (else the default) is a nonzero integer; unset without a
    /// default is false.
    pub fn get_bool(&self, name: &str) -> bool {
        self.int_opt(checked(name, &[Bool, Int])).is_some_and(|v| v != 0)
    }

    /// NCCL_COMM_BLOCKING as NCCL reads it: 0 or 1 overrides every communicator's
    /// `ncclConfig_t.blocking`; unset (or any other value) leaves the config in charge.
    pub fn comm_blocking(&self) -> Option<bool> {
        match self.get_int_opt("NCCL_COMM_BLOCKING") {
            Some(0) => Some(false),
            Some(1) => Some(true),
            _ => None,
        }
    }

    /// A byte count: the value (plain or with a K/M/G/T suffix), else the default.
    pub fn get_bytes(&self, name: &str) -> u64 {
        let p = checked(name, &[Bytes, Int]);
        debug_assert!(!p.default.is_empty(), "{name} has no default");
        self.get_bytes_opt(p.name).unwrap_or(0)
    }

    /// A byte count as set, else the default, else `None` (for defaults that mean "auto").
    pub fn get_bytes_opt(&self, name: &str) -> Option<u64> {
        let p = checked(name, &[Bytes, Int]);
        self.raw(p).and_then(parse_bytes).or_else(|| parse_bytes(p.default))
    }

    /// A duration in seconds as set, else the default; `None` when neither is set or the
    /// value is 0 (for parameters where 0 means "no limit").
    pub fn get_seconds_opt(&self, name: &str) -> Option<std::time::Duration> {
        let p = checked(name, &[Seconds]);
        self.raw(p).and_then(parse_seconds).or_else(|| parse_seconds(p.default)).filter(|d| !d.is_zero())
    }

    /// Where the value of `name` came from, or `None` when unset.
    pub fn source(&self, name: &str) -> Option<&Source> {
        let p = checked(name, &[Int, Bool, Str, Bytes, Seconds]);
        self.settings.get(p.name).map(|s| &s.source)
    }

    /// Messages about invalid values and unreadable config files, in registry order.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// NCCL's ENV-subsystem lines, one per valid set parameter, e.g.
    /// `NCCL_SOCKET_IFNAME set by environment to eth0` (numbers end with a period, as NCCL).
    pub fn env_log_lines(&self) -> Vec<String> {
        let mut lines = Vec::new();
        for p in PARAMS {
            let Some(s) = self.settings.get(p.name) else {
                continue;
            };
            let by = match &s.source {
                Source::Environment => "environment",
                Source::ConfFile(label) => label.as_str(),
            };
            match p.kind {
                Str => lines.push(format!("{} set by {by} to {}", p.name, s.value)),
                Seconds => {
                    if let Some(d) = parse_seconds(&s.value) {
                        lines.push(format!("{} set by {by} to {}.", p.name, d.as_secs_f64()));
                    }
                }
                Int | Bool | Bytes => {
                    if let Some(v) = parse_number(p.kind, &s.value) {
                        lines.push(format!("{} set by {by} to {v}.", p.name));
                    }
                }
            }
        }
        lines
    }

    fn raw(&self, p: &Param) -> Option<&str> {
        self.settings.get(p.name).map(|s| s.value.as_str())
    }

    fn int_opt(&self, p: &Param) -> Option<i64> {
        self.raw(p).and_then(parse_int).or_else(|| parse_int(p.default))
    }
}

/// The process-wide snapshot, read on first use.
pub fn snapshot() -> &'static Snapshot {
    static GLOBAL: OnceLock<Snapshot> = OnceLock::new();
    GLOBAL.get_or_init(Snapshot::from_process)
}

/// [`Snapshot::get_str`] on the process snapshot.
pub fn get_str(name: &str) -> Option<String> {
    snapshot().get_str(name)
}

/// [`Snapshot::get_str_or_default`] on the process snapshot.
pub fn get_str_or_default(name: &str) -> Option<String> {
    snapshot().get_str_or_default(name)
}

/// [`Snapshot::get_int`] on the process snapshot.
pub fn get_int(name: &str) -> i64 {
    snapshot().get_int(name)
}

/// [`Snapshot::get_int_opt`] on the process snapshot.
pub fn get_int_opt(name: &str) -> Option<i64> {
    snapshot().get_int_opt(name)
}

/// [`Snapshot::get_bool`] on the process snapshot.
pub fn get_bool(name: &str) -> bool {
    snapshot().get_bool(name)
}

/// [`Snapshot::comm_blocking`] on the process snapshot.
pub fn comm_blocking() -> Option<bool> {
    snapshot().comm_blocking()
}

/// [`Snapshot::get_bytes_opt`] on the process snapshot.
pub fn get_bytes_opt(name: &str) -> Option<u64> {
    snapshot().get_bytes_opt(name)
}

/// [`Snapshot::get_bytes`] on the process snapshot.
pub fn get_bytes(name: &str) -> u64 {
    snapshot().get_bytes(name)
}

/// [`Snapshot::get_seconds_opt`] on the process snapshot.
pub fn get_seconds_opt(name: &str) -> Option<std::time::Duration> {
    snapshot().get_seconds_opt(name)
}

/// [`Snapshot::warnings`] on the process snapshot.
pub fn warnings() -> &'static [String] {
    snapshot().warnings()
}

/// [`Snapshot::env_log_lines`] on the process snapshot.
pub fn env_log_lines() -> Vec<String> {
    snapshot().env_log_lines()
}

/// Config files to read, highest precedence first, each with whether the user named it
/// explicitly (then a missing file is worth a warning).
fn conf_file_paths(lookup: &impl Fn(&str) -> Option<String>) -> Vec<(String, bool)> {
    let mut paths = Vec::new();
    if let Some(path) = lookup("NCCL_CONF_FILE").filter(|v| !v.is_empty()) {
        paths.push((path, true));
    } else if let Some(home) = lookup("HOME").filter(|v| !v.is_empty()) {
        paths.push((format!("{}/.nccl.conf", home.trim_end_matches('/')), false));
    }
    paths.push(("/etc/nccl.conf".to_owned(), false));
    paths
}

/// `NAME=value` pairs of a config file, in file order (a later line overrides an earlier).
fn parse_conf(text: &str) -> impl Iterator<Item = (&str, String)> {
    text.lines().filter_map(|line| {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            return None;
        }
        let (name, value) = line.split_once('=')?;
        let (name, value) = (name.trim(), value.trim());
        (!name.is_empty() && !value.is_empty()).then(|| (name, value.to_owned()))
    })
}

fn invalid_value_message(p: &Param, value: &str) -> String {
    let default = if p.default.is_empty() {
        "(unset)".to_owned()
    } else {
        parse_number(p.kind, p.default).map_or_else(|| p.default.to_owned(), |v| v.to_string())
    };
    format!("Invalid value {value} for {}, using default {default}.", p.name)
}

/// The numeric value of `text` for numeric kinds; `None` when invalid or a string kind.
fn parse_number(kind: ParamKind, text: &str) -> Option<i128> {
    match kind {
        Int | Bool => parse_int(text).map(i128::from),
        Bytes => parse_bytes(text).map(i128::from),
        Str | Seconds => None,
    }
}

/// Whether `text` is a valid value of `kind`.
fn is_valid(kind: ParamKind, text: &str) -> bool {
    match kind {
        Str => true,
        Seconds => parse_seconds(text).is_some(),
        Int | Bool | Bytes => parse_number(kind, text).is_some(),
    }
}

/// A non-negative, finite number of seconds, integer or decimal: `5`, `0.25`, `2.`.
fn parse_seconds(text: &str) -> Option<std::time::Duration> {
    let t = text.trim();
    if t.is_empty() || !t.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return None;
    }
    let v: f64 = t.parse().ok()?;
    std::time::Duration::try_from_secs_f64(v).ok()
}

/// A signed decimal or `0x` hex integer, surrounding whitespace allowed.
fn parse_int(text: &str) -> Option<i64> {
    let t = text.trim();
    let (negative, digits) = match t.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    let magnitude = parse_unsigned(digits)?;
    if negative {
        0i64.checked_sub_unsigned(magnitude)
    } else {
        i64::try_from(magnitude).ok()
    }
}

fn parse_unsigned(digits: &str) -> Option<u64> {
    let (digits, radix) = match digits.strip_prefix("0x").or_else(|| digits.strip_prefix("0X")) {
        Some(hex) => (hex, 16),
        None => (digits, 10),
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    u64::from_str_radix(digits, radix).ok()
}

/// A byte count: an unsigned integer with an optional K/M/G/T suffix (powers of 1024),
/// optionally followed by `B` or `iB`, case-insensitive: `4194304`, `512K`, `1G`, `2MiB`.
fn parse_bytes(text: &str) -> Option<u64> {
    let t = text.trim();
    // Hex digits include b/B, so "16B" must split at the first non-decimal digit.
    let end = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) => 2 + hex.find(|c: char| !c.is_ascii_hexdigit()).unwrap_or(hex.len()),
        None => t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len()),
    };
    let (number, suffix) = t.split_at(end);
    let base = parse_unsigned(number)?;
    let suffix = suffix.trim_start().to_ascii_lowercase();
    let shift = match suffix.as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return None,
    };
    base.checked_mul(1u64 << shift)
}

/// Resolves `name` in the registry; debug builds panic on unknown names and wrong kinds.
fn checked(name: &str, kinds: &[ParamKind]) -> &'static Param {
    match param_info(name) {
        Some(p) => {
            debug_assert!(kinds.contains(&p.kind), "{name} is a {} parameter", p.kind.as_str());
            p
        }
        None => {
            debug_assert!(false, "{name} is not in env::PARAMS");
            &UNKNOWN
        }
    }
}

/// Stands in for a mistyped name in release builds: never set, no default.
static UNKNOWN: Param = param("", Str, "", "");

const TABLE_BEGIN: &str = "<!-- env-table:begin -->";
const TABLE_END: &str = "<!-- env-table:end -->";

/// The README's environment table, generated from [`PARAMS`].
pub fn markdown_table() -> String {
    let mut out = String::from("| Variable | Type | Default | Meaning |\n|---|---|---|---|\n");
    for p in PARAMS {
        let default = if p.default.is_empty() { "unset".to_owned() } else { format!("`{}`", p.default) };
        // invariant: writing to a String cannot fail.
        let _ = writeln!(out, "| `{}` | {} | {} | {} |", p.name, p.kind.as_str(), default, markdown_escape(p.help));
    }
    out
}

/// Escapes the characters that would otherwise break a table cell or vanish as HTML.
fn markdown_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '|' | '<' | '*' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Returns `readme` with the text between the `<!-- env-table:begin -->` and
/// `<!-- env-table:end -->` lines replaced by [`markdown_table`]. Without both markers the
/// section is appended at the end.
pub fn write_readme_table(readme: &str) -> String {
    let table = markdown_table();
    match table_section(readme) {
        Some((start, end)) => format!("{}{table}{}", &readme[..start], &readme[end..]),
        None => {
            let sep = if readme.is_empty() || readme.ends_with('\n') { "" } else { "\n" };
            format!("{readme}{sep}{TABLE_BEGIN}\n{table}{TABLE_END}\n")
        }
    }
}

/// Byte range of the text strictly between the marker lines (start = after the begin
/// line's newline, end = start of the end line).
fn table_section(readme: &str) -> Option<(usize, usize)> {
    let mut offset = 0;
    let mut start = None;
    for line in readme.split_inclusive('\n') {
        match (start, line.trim()) {
            (None, TABLE_BEGIN) => start = Some(offset + line.len()),
            (Some(s), TABLE_END) => return Some((s, offset)),
            _ => {}
        }
        offset += line.len();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(env: &[(&str, &str)], files: &[&str]) -> Snapshot {
        let env: HashMap<String, String> = env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        Snapshot::from_lookup(|name| env.get(name).cloned(), files)
    }

    #[test]
    fn registry_is_consistent() {
        for (i, p) in PARAMS.iter().enumerate() {
            assert!(p.name.starts_with("NCCL_") || p.name.starts_with("FERROCCL_"), "{}", p.name);
            assert!(!p.help.is_empty() && !p.help.contains('\n'), "{}", p.name);
            assert!(PARAMS[..i].iter().all(|q| q.name != p.name), "duplicate {}", p.name);
            if !p.default.is_empty() {
                assert!(is_valid(p.kind, p.default), "bad default {}", p.name);
            }
        }
    }

    #[test]
    fn defaults_when_unset() {
        let s = snap(&[], &[]);
        assert_eq!(s.get_int("NCCL_SOCKET_RETRY_CNT"), 34);
        assert_eq!(s.get_int("NCCL_SOCKET_RETRY_SLEEP_MSEC"), 100);
        assert_eq!(s.get_int_opt("NCCL_IB_GID_INDEX"), Some(-1));
        assert_eq!(s.get_int("NCCL_IB_TIMEOUT"), 20);
        assert_eq!(s.get_int("NCCL_IB_RETRY_CNT"), 7);
        assert_eq!(s.get_str("NCCL_IB_HCA"), None);
        assert_eq!(s.get_int("FERROCCL_BOOTSTRAP_TIMEOUT"), 120);
        assert_eq!(s.get_bytes("NCCL_BUFFSIZE"), 4_194_304);
        assert_eq!(s.get_bytes("FERROCCL_CHUNK_SIZE"), 524_288);
        assert_eq!(s.get_bytes("FERROCCL_TREE_THRESHOLD"), 65_536);
        assert_eq!(s.get_bytes("FERROCCL_TLS_REKEY_BYTES"), 1 << 30);
        assert!(!s.get_bool("NCCL_SHM_DISABLE"));
        assert!(!s.get_bool("NCCL_COMM_BLOCKING"));
        assert_eq!(s.get_int_opt("NCCL_COMM_BLOCKING"), None);
        assert_eq!(s.comm_blocking(), None);
        assert_eq!(s.get_int_opt("NCCL_SOCKET_NTHREADS"), None);
        assert_eq!(s.get_str("NCCL_DEBUG"), None);
        assert_eq!(s.get_str("NCCL_DEBUG_SUBSYS"), None);
        assert_eq!(s.get_str_or_default("NCCL_DEBUG_SUBSYS").as_deref(), Some("INIT,BOOTSTRAP,ENV"));
        assert_eq!(s.get_str_or_default("FERROCCL_ENCRYPTION_POLICY").as_deref(), Some("default"));
        assert_eq!(s.get_str_or_default("NCCL_SOCKET_IFNAME"), None);
        assert!(s.warnings().is_empty());
        assert!(s.env_log_lines().is_empty());
    }

    #[test]
    fn values_from_environment() {
        let s = snap(
            &[
                ("NCCL_SOCKET_IFNAME", "eth0"),
                ("NCCL_SHM_DISABLE", "1"),
                ("NCCL_SOCKET_NTHREADS", "4"),
                ("NCCL_COMM_BLOCKING", "0"),
                ("NCCL_SOCKET_RETRY_CNT", " 0x10 "),
                ("FERROCCL_BOOTSTRAP_TIMEOUT", "-5"),
                ("NCCL_DEBUG", ""),
            ],
            &[],
        );
        assert_eq!(s.get_str("NCCL_SOCKET_IFNAME").as_deref(), Some("eth0"));
        assert!(s.get_bool("NCCL_SHM_DISABLE"));
        assert_eq!(s.get_int_opt("NCCL_SOCKET_NTHREADS"), Some(4));
        assert_eq!(s.get_int_opt("NCCL_COMM_BLOCKING"), Some(0));
        assert_eq!(s.comm_blocking(), Some(false));
        assert_eq!(snap(&[("NCCL_COMM_BLOCKING", "1")], &[]).comm_blocking(), Some(true));
        assert_eq!(snap(&[("NCCL_COMM_BLOCKING", "2")], &[]).comm_blocking(), None, "only 0 and 1 override");
        assert_eq!(s.get_int("NCCL_SOCKET_RETRY_CNT"), 16);
        assert_eq!(s.get_int("FERROCCL_BOOTSTRAP_TIMEOUT"), -5);
        // Empty counts as unset, as in NCCL.
        assert_eq!(s.get_str("NCCL_DEBUG"), None);
        assert_eq!(s.source("NCCL_SHM_DISABLE"), Some(&Source::Environment));
        assert_eq!(s.source("NCCL_DEBUG"), None);
        assert!(s.warnings().is_empty());
    }

    #[test]
    fn seconds_parse_integers_and_fractions() {
        use std::time::Duration;
        assert_eq!(snap(&[], &[]).get_seconds_opt("FERROCCL_TIMEOUT"), None);
        for (text, want) in [("5", Some(5000)), (" 0.25 ", Some(250)), ("2.", Some(2000)), ("0", None), ("0.0", None)] {
            let s = snap(&[("FERROCCL_TIMEOUT", text)], &[]);
            assert_eq!(s.get_seconds_opt("FERROCCL_TIMEOUT"), want.map(Duration::from_millis), "{text:?}");
            assert!(s.warnings().is_empty(), "{text:?}");
        }
        for bad in ["-1", "5s", "inf", "NaN", "1e3", "."] {
            let s = snap(&[("FERROCCL_TIMEOUT", bad)], &[]);
            assert_eq!(s.get_seconds_opt("FERROCCL_TIMEOUT"), None, "{bad:?}");
            assert_eq!(s.warnings().len(), 1, "{bad:?} should warn");
        }
        let s = snap(&[("FERROCCL_TIMEOUT", "1.5")], &[]);
        assert_eq!(s.env_log_lines(), vec!["FERROCCL_TIMEOUT set by environment to 1.5.".to_owned()]);
    }

    #[test]
    fn bad_values_fall_back_with_warning() {
        let s = snap(
            &[
                ("NCCL_SOCKET_RETRY_CNT", "many"),
                ("NCCL_IB_DISABLE", "yes"),
                ("NCCL_BUFFSIZE", "4X"),
                ("NCCL_SOCKET_NTHREADS", "12abc"),
                ("FERROCCL_CHUNK_SIZE", "-1"),
            ],
            &[],
        );
        assert_eq!(s.get_int("NCCL_SOCKET_RETRY_CNT"), 34);
        assert!(!s.get_bool("NCCL_IB_DISABLE"));
        assert_eq!(s.get_bytes("NCCL_BUFFSIZE"), 4_194_304);
        assert_eq!(s.get_int_opt("NCCL_SOCKET_NTHREADS"), None);
        assert_eq!(s.get_bytes("FERROCCL_CHUNK_SIZE"), 524_288);
        // Registry order.
        let expected = [
            "Invalid value 12abc for NCCL_SOCKET_NTHREADS, using default (unset).",
            "Invalid value many for NCCL_SOCKET_RETRY_CNT, using default 34.",
            "Invalid value yes for NCCL_IB_DISABLE, using default 0.",
            "Invalid value 4X for NCCL_BUFFSIZE, using default 4194304.",
            "Invalid value -1 for FERROCCL_CHUNK_SIZE, using default 524288.",
        ];
        assert_eq!(s.warnings(), expected);
        // Invalid values produce no "set by" line.
        assert!(s.env_log_lines().is_empty());
    }

    #[test]
    fn bytes_suffixes() {
        assert_eq!(parse_bytes("0"), Some(0));
        assert_eq!(parse_bytes("4194304"), Some(4_194_304));
        assert_eq!(parse_bytes("512K"), Some(512 << 10));
        assert_eq!(parse_bytes("512k"), Some(512 << 10));
        assert_eq!(parse_bytes("4M"), Some(4 << 20));
        assert_eq!(parse_bytes("4 MiB"), Some(4 << 20));
        assert_eq!(parse_bytes("1G"), Some(1 << 30));
        assert_eq!(parse_bytes("1GB"), Some(1 << 30));
        assert_eq!(parse_bytes("2T"), Some(2 << 40));
        assert_eq!(parse_bytes("16B"), Some(16));
        assert_eq!(parse_bytes("0x100"), Some(256));
        assert_eq!(parse_bytes("0x1K"), Some(1024));
        assert_eq!(parse_bytes("-1"), None);
        assert_eq!(parse_bytes("1.5G"), None);
        assert_eq!(parse_bytes("G"), None);
        assert_eq!(parse_bytes("1P"), None);
        assert_eq!(parse_bytes("99999999999T"), None);
        assert_eq!(parse_bytes(""), None);
    }

    #[test]
    fn ints() {
        assert_eq!(parse_int("42"), Some(42));
        assert_eq!(parse_int("-42"), Some(-42));
        assert_eq!(parse_int("+7"), Some(7));
        assert_eq!(parse_int("0xff"), Some(255));
        assert_eq!(parse_int("-9223372036854775808"), Some(i64::MIN));
        assert_eq!(parse_int("9223372036854775808"), None);
        assert_eq!(parse_int("1e3"), None);
        assert_eq!(parse_int("--1"), None);
        assert_eq!(parse_int(""), None);
    }

    #[test]
    fn conf_file_precedence() {
        let user = "# user settings\nNCCL_SOCKET_IFNAME=ib0\n  NCCL_SHM_DISABLE = 1  \nbogus line\n";
        let etc = "NCCL_SOCKET_IFNAME=eth0\nNCCL_P2P_DISABLE=1\nNCCL_DEBUG=WARN\n\
                   NCCL_IB_DISABLE=1\nNCCL_UNKNOWN_THING=3\nNCCL_CONF_FILE=/x\n";
        let s = snap(&[("NCCL_DEBUG", "INFO")], &[user, etc]);
        // Environment over files.
        assert_eq!(s.get_str("NCCL_DEBUG").as_deref(), Some("INFO"));
        // User file over /etc.
        assert_eq!(s.get_str("NCCL_SOCKET_IFNAME").as_deref(), Some("ib0"));
        assert!(s.get_bool("NCCL_SHM_DISABLE"));
        // /etc alone.
        assert!(s.get_bool("NCCL_P2P_DISABLE"));
        assert_eq!(s.source("NCCL_P2P_DISABLE"), Some(&Source::ConfFile("config file #2".into())));
        // NCCL_CONF_FILE only comes from the environment.
        assert_eq!(s.get_str("NCCL_CONF_FILE"), None);
        assert!(s.warnings().is_empty());
        // A later line in the same file wins.
        let s = snap(&[], &["NCCL_ALGO=ring\nNCCL_ALGO=tree\n"]);
        assert_eq!(s.get_str("NCCL_ALGO").as_deref(), Some("tree"));
        // Values may contain '='.
        let s = snap(&[], &["NCCL_ALGO=ring;allreduce=tree\n"]);
        assert_eq!(s.get_str("NCCL_ALGO").as_deref(), Some("ring;allreduce=tree"));
    }

    #[test]
    fn conf_file_paths_follow_nccl() {
        let lookup = |n: &str| (n == "HOME").then(|| "/home/u/".to_owned());
        assert_eq!(
            conf_file_paths(&lookup),
            [("/home/u/.nccl.conf".to_owned(), false), ("/etc/nccl.conf".to_owned(), false)]
        );
        let lookup = |n: &str| match n {
            "HOME" => Some("/home/u".to_owned()),
            "NCCL_CONF_FILE" => Some("/opt/my.conf".to_owned()),
            _ => None,
        };
        assert_eq!(conf_file_paths(&lookup), [("/opt/my.conf".to_owned(), true), ("/etc/nccl.conf".to_owned(), false)]);
    }

    #[test]
    fn env_lines_match_nccl() {
        let s = snap(
            &[("NCCL_SOCKET_IFNAME", "eth0"), ("NCCL_IB_DISABLE", "1"), ("FERROCCL_TLS_REKEY_BYTES", "2M")],
            &["NCCL_ALGO=ring\n"],
        );
        assert_eq!(
            s.env_log_lines(),
            [
                "NCCL_SOCKET_IFNAME set by environment to eth0",
                "NCCL_IB_DISABLE set by environment to 1.",
                "NCCL_ALGO set by config file #1 to ring",
                "FERROCCL_TLS_REKEY_BYTES set by environment to 2097152.",
            ]
        );
    }

    #[test]
    #[should_panic(expected = "not in env::PARAMS")]
    #[cfg(debug_assertions)]
    fn unknown_name_panics_in_debug() {
        snap(&[], &[]).get_str("NCCL_SOCKET_IFNAMES");
    }

    #[test]
    fn table_rows() {
        let table = markdown_table();
        assert!(table.starts_with("| Variable | Type | Default | Meaning |\n|---|---|---|---|\n"));
        assert_eq!(table.lines().count(), PARAMS.len() + 2);
        assert!(table.contains("| `NCCL_SOCKET_RETRY_CNT` | int | `34` | "));
        assert!(table.contains("| `NCCL_DEBUG` | string | unset | "));
    }

    #[test]
    fn readme_section_is_replaced() {
        let readme = "# x\n\nintro\n<!-- env-table:begin -->\nold\n<!-- env-table:end -->\ntail\n";
        let out = write_readme_table(readme);
        assert_eq!(
            out,
            format!("# x\n\nintro\n<!-- env-table:begin -->\n{}<!-- env-table:end -->\ntail\n", markdown_table())
        );
        // Idempotent.
        assert_eq!(write_readme_table(&out), out);
        // Without markers: appended.
        let out = write_readme_table("# x");
        assert!(out.starts_with("# x\n<!-- env-table:begin -->\n"));
        assert!(table_section(&out).is_some());
    }

    /// The README's env table must match [`PARAMS`]. To regenerate it, run
    /// `FERROCCL_BLESS=1 cargo test readme_env_table_is_current` (or the repo's tool that
    /// calls `env::write_readme_table`).
    #[test]
    fn readme_env_table_is_current() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/README.md");
        let how = "regenerate it with `FERROCCL_BLESS=1 cargo test readme_env_table_is_current` \
                   (writes env::write_readme_table's output to README.md)";
        let readme = std::fs::read_to_string(path).unwrap_or_default();
        if std::env::var_os("FERROCCL_BLESS").is_some() {
            let updated = write_readme_table(&readme);
            if updated != readme {
                std::fs::write(path, updated).expect("write README.md");
            }
            return;
        }
        let Some((start, end)) = table_section(&readme) else {
            panic!("{path} is missing or lacks the {TABLE_BEGIN} / {TABLE_END} lines; {how}");
        };
        assert!(
            readme[start..end].trim() == markdown_table().trim(),
            "the environment table in {path} is out of date; {how}"
        );
    }
}
